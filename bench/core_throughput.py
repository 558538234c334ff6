"""Throughput benchmark of the core library (``python bench/core_throughput.py [-n N]``, in
``make bench``).

Prints readings per second for perturbation with the default secure randomness, and for
decode + estimate_mean, on one core. Targets: >= 1e6 perturbations/s and
>= 2e7 decoded codes/s. Figures vary with the machine; the best of several runs is shown.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from zeal import Zeal

__all__ = ["run"]


def _best_rate(n: int, repeats: int, fn: object) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return n / best


def run(*, n: int = 1_000_000, repeats: int = 5) -> dict[str, float]:
    """Measure and print the figures (pinned to one CPU where the OS allows); returns them."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    params = Zeal(lower=23.5, upper=83.9, epsilon=1.0)
    readings = np.random.default_rng(0).uniform(params.lower, params.upper, n)
    codes = params.perturb(readings)

    def decode_and_estimate() -> None:
        params.decode(codes)
        params.estimate_mean(codes)

    figures = {
        "perturb_per_s": _best_rate(n, repeats, lambda: params.perturb(readings)),
        "decode_estimate_per_s": _best_rate(n, repeats, decode_and_estimate),
        "estimate_only_per_s": _best_rate(n, repeats, lambda: params.estimate_mean(codes)),
    }
    print(
        f"params: {params!r}; n = {n:,}; best of {repeats}; "
        "one core; secure randomness (os.urandom)"
    )
    print(
        f"perturb                {figures['perturb_per_s']:>16,.0f} readings/s  (target 1,000,000)"
    )
    print(
        f"decode + estimate_mean {figures['decode_estimate_per_s']:>16,.0f} codes/s"
        "     (target 20,000,000)"
    )
    print(f"estimate_mean only     {figures['estimate_only_per_s']:>16,.0f} codes/s")
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000_000, help="readings per run")
    run(n=parser.parse_args().n)
