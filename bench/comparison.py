"""Group comparisons on simulated fleets like real ones: type-I error, coverage and
robustness of the /compare methods (zeal.compare), beside the old reading-level statistic.

Each fleet has two groups of devices drawn from one population: readings per device
uniform in a range, device means that differ (lognormal spread), most readings zero, a
lognormal positive part; every reading privatized with Zeal (grid sampler) and decoded,
as the server sees it. Two settings:

- "noise": epsilon 1, 40-159 readings per device (Zeal's noise dominates);
- "devices": epsilon 4, 200-599 readings per device (the spread between devices dominates).

Writes bench/COMPARISON.md (seeded: a rerun gives the same figures).

    python bench/comparison.py [--reps 2000] [--out bench/COMPARISON.md]
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zeal import Zeal
from zeal.compare import Partitions, cluster_weighted, device_means, trimmed
from zeal.planning.comparison import Plan, plan_comparison

HERE = Path(__file__).resolve().parent
UPPER = 100.0
ZERO_SHARE = 0.6


@dataclass(frozen=True)
class Setting:
    name: str
    epsilon: float
    readings: tuple[int, int]
    shift: float  # the true difference (before clipping) for coverage and power
    devices: int = 20

    @property
    def readings_moments(self) -> tuple[float, float]:
        """Mean and coefficient of variation of readings per device (discrete uniform)."""
        low, high = self.readings
        mean = (low + high - 1) / 2
        return mean, math.sqrt(((high - low) ** 2 - 1) / 12) / mean


SETTINGS = (Setting("noise", 1.0, (40, 160), 7.0), Setting("devices", 4.0, (200, 600), 2.0))


def draw(rng: np.random.Generator, n: int, centre: float, shift: float) -> np.ndarray:
    """n raw readings of one device: zero with ZERO_SHARE, else lognormal around `centre`,
    plus `shift` (a true difference), inside [0, UPPER]."""
    x = np.where(rng.random(n) < ZERO_SHARE, 0.0, rng.lognormal(math.log(centre), 0.7, n))
    return np.clip(x + shift, 0.0, UPPER)


def group(
    rng: np.random.Generator,
    params: Zeal,
    setting: Setting,
    *,
    shift: float = 0.0,
    faulty: bool = False,
) -> tuple[Partitions, np.ndarray]:
    """One group's partitions (readings and decoded sums per device) and all its decoded
    readings; a faulty group's first device reports the top of the range."""
    counts = rng.integers(*setting.readings, size=setting.devices)
    centres = rng.lognormal(1.5, 0.8, size=setting.devices)
    sums, every = [], []
    for i, (n, centre) in enumerate(zip(counts, centres, strict=True)):
        raw = np.full(n, UPPER) if faulty and i == 0 else draw(rng, n, centre, shift)
        decoded = params.decode(params.perturb(raw, rng=rng))
        sums.append(float(decoded.sum()))
        every.append(decoded)
    return Partitions.of(counts, sums), np.concatenate(every)


def population_difference(shift: float, rng: np.random.Generator) -> float:
    """E[reading | shifted] - E[reading] over the population (10**7 draws; the clipping at
    UPPER makes it slightly less than the shift)."""
    size = 10**7
    centres = rng.lognormal(1.5, 0.8, size)
    x = np.where(rng.random(size) < ZERO_SHARE, 0.0, rng.lognormal(np.log(centres), 0.7))
    return float(np.clip(x + shift, 0, UPPER).mean() - np.clip(x, 0, UPPER).mean())


def population_moments(rng: np.random.Generator) -> tuple[float, float, float]:
    """(mean reading, spread of device means, spread of readings within a device) of the
    population, from 20,000 devices of 400 readings (the between-device variance corrected
    for the within-device part left in 400-reading means)."""
    devices, per = 20_000, 400
    centres = rng.lognormal(1.5, 0.8, devices)[:, None]
    zero = rng.random((devices, per)) < ZERO_SHARE
    x = np.clip(np.where(zero, 0.0, rng.lognormal(np.log(centres), 0.7, (devices, per))), 0, UPPER)
    within = float(x.var(axis=1, ddof=1).mean())
    between = float(x.mean(axis=1).var(ddof=1)) - within / per
    return float(x.mean()), math.sqrt(between), math.sqrt(within)


def reading_level(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """The old route's statistic: (difference, p-value) with readings as the units."""
    se = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    z = (a.mean() - b.mean()) / se
    return float(a.mean() - b.mean()), math.erfc(abs(z) / math.sqrt(2))


def binomial_se(rate: float, reps: int) -> float:
    return math.sqrt(max(rate * (1 - rate), 1e-12) / reps)


@dataclass(frozen=True)
class Result:
    setting: Setting
    reps: int
    level: dict[str, float]  # rejection rates at 0.05 with no true difference
    coverage: dict[str, float]  # of the 95 % CI with a true difference
    truth: float
    plans: dict[str, Plan]  # the planner's figures for this fleet by shape, at the truth
    spread: tuple[float, float]  # simulated SD of the difference, and its Monte Carlo SE
    power: float  # simulated rejection rate at the true difference
    plain_bias: tuple[float, float]  # (bias, its Monte Carlo standard error)
    trimmed_bias: tuple[float, float]


def _mean_and_se(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values, ddof=1) / math.sqrt(len(values)))


def run(setting: Setting, reps: int, seed: int) -> Result:
    params = Zeal(lower=0.0, upper=UPPER, epsilon=setting.epsilon)
    rng = np.random.default_rng(seed)
    level = {"cluster": 0, "device_means": 0, "trimmed": 0, "reading": 0}
    covered = {"cluster": 0, "device_means": 0}
    shift = setting.shift
    truth = population_difference(shift, np.random.default_rng(seed + 1))
    mean, between, within = population_moments(np.random.default_rng(seed + 2))
    readings, readings_cv = setting.readings_moments
    plans = {
        shape: plan_comparison(
            params,
            devices=setting.devices,
            readings=round(readings),
            readings_cv=readings_cv,
            between_sd=between,
            within_sd=within,
            mean=mean + truth / 2,  # the two groups' average reading
            shape=shape,
            effect=truth,
        )
        for shape in ("lognormal", "normal")
    }
    plain, cut, shifted = [], [], []
    rejected = 0
    for _ in range(reps):
        (a, va), (b, vb) = group(rng, params, setting), group(rng, params, setting)
        level["cluster"] += cluster_weighted(a, b).p_value < 0.05
        level["device_means"] += device_means(a, b).p_value < 0.05
        level["reading"] += reading_level(va, vb)[1] < 0.05
        found = trimmed(a, b, proportion=0.1)
        level["trimmed"] += found.p_value < 0.05
        (a2, _), (b2, _) = group(rng, params, setting, shift=shift), group(rng, params, setting)
        for name, method in (("cluster", cluster_weighted), ("device_means", device_means)):
            found = method(a2, b2)
            low, high = found.ci
            covered[name] += low <= truth <= high
            if name == "cluster":
                shifted.append(found.difference)
                rejected += found.p_value < 0.05
        (a3, _), (b3, _) = group(rng, params, setting, faulty=True), group(rng, params, setting)
        plain.append(device_means(a3, b3).difference)
        cut.append(trimmed(a3, b3, proportion=0.1).difference)
    # Without a fault every difference is 0 in expectation (one population, and each
    # estimator treats the groups alike), so the bias is the mean difference with it.
    plain_bias = _mean_and_se(plain)
    return Result(
        setting=setting,
        reps=reps,
        level={k: v / reps for k, v in level.items()},
        coverage={k: v / reps for k, v in covered.items()},
        truth=truth,
        plans=plans,
        spread=(
            float(np.std(shifted, ddof=1)),
            float(np.std(shifted, ddof=1)) / math.sqrt(2 * (reps - 1)),
        ),
        power=rejected / reps,
        plain_bias=plain_bias,
        trimmed_bias=_mean_and_se(cut),
    )


def _rate(rate: float, reps: int) -> str:
    return f"{rate:.4f} ± {binomial_se(rate, reps):.4f}"


def report(results: list[Result], seconds: float) -> str:
    header = (
        "| setting | epsilon | readings per device | repetitions | type-I at 0.05: cluster "
        "| device_means | trimmed | reading-level (old route) | 95 % coverage: cluster "
        "| device_means |"
    )
    lines = [
        "# Group comparisons on simulated fleets",
        "",
        f"Written by `python bench/comparison.py` in {seconds / 60:.1f} minutes (seeded). "
        "Two groups of 20 devices from one population; device means lognormal "
        f"(sigma 0.8), {ZERO_SHARE:.0%} zeros, lognormal positive part (sigma 0.7), range "
        f"0-{UPPER:g}, every reading privatized with Zeal and decoded. See docs/comparison.md.",
        "",
        header,
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r.setting
        lines.append(
            f"| {s.name} | {s.epsilon:g} | {s.readings[0]}-{s.readings[1] - 1} | {r.reps} | "
            f"{_rate(r.level['cluster'], r.reps)} | {_rate(r.level['device_means'], r.reps)} | "
            f"{_rate(r.level['trimmed'], r.reps)} | "
            f"{_rate(r.level['reading'], r.reps)} | {_rate(r.coverage['cluster'], r.reps)} | "
            f"{_rate(r.coverage['device_means'], r.reps)} |"
        )
    lines += [
        "",
        "Robustness: group A's first device reports the top of the range for every reading;",
        "both groups otherwise from one population, so every estimator's difference (A - B)",
        "is 0 without the fault. Its bias with the fault, ± its Monte Carlo standard error,",
        "and the bias in those standard errors:",
        "",
        "| setting | mean of device means | `method=trimmed` (each group's trimmed mean of "
        "device means, 10 %) |",
        "|---|---|---|",
    ]
    for r in results:
        cells = [
            f"{bias:.3f} ± {se:.3f} ({abs(bias) / se:.1f} SE)"
            for bias, se in (r.plain_bias, r.trimmed_bias)
        ]
        lines.append(f"| {r.setting.name} | {' | '.join(cells)} |")
    lines += [
        "",
        "Planner (`GET /preview/compare`, zeal.planning.comparison) against the same fleets: "
        "the population's",
        "moments (mean reading, spread of device means, spread within a device), the mean and",
        "coefficient of variation of readings per device, effect = the true difference;",
        "simulated: the default method (cluster) on the shifted fleets above.",
        "",
        "| setting | effect | planned SE | simulated SD of the difference | ratio "
        "| simulated power | planned power: shape=lognormal | difference "
        "| shape=normal | difference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        sd, sd_se = r.spread
        skewed, normal = r.plans["lognormal"], r.plans["normal"]
        lines.append(
            f"| {r.setting.name} | {r.truth:.4f} | {skewed.std_error:.4f} | {sd:.4f} ± "
            f"{sd_se:.4f} | {skewed.std_error / sd:.4f} | {_rate(r.power, r.reps)} | "
            f"{skewed.power:.4f} | {skewed.power - r.power:+.4f} | {normal.power:.4f} | "
            f"{normal.power - r.power:+.4f} |"
        )
    truths = ", ".join(f"{r.setting.name} {r.truth:.4f}" for r in results)
    shifts = ", ".join(f"{r.setting.name} {r.setting.shift:g}" for r in results)
    lines += [
        "",
        "The ± figures are one standard error (binomial for rates). Coverage and power are "
        f"at the population difference made by a shift before clipping ({shifts}): "
        f"{truths}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=HERE / "COMPARISON.md")
    args = parser.parse_args()
    began = time.time()
    results = [run(s, args.reps, seed=40 + i) for i, s in enumerate(SETTINGS)]
    text = report(results, time.time() - began)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
