"""The validity of every /compare method on simulated fleets like real ones: type-I error,
coverage of the method's stated estimand, and power (bench/validity.py runs the matrix,
tests/shared/test_validity.py a reduced, seeded version).

A fleet is two groups of devices. Devices differ from each other (device means drawn from
a lognormal, right-skewed, or a normal), a reading is zero with probability 0.4 and
otherwise gamma-distributed (shape 2) around its device's level, clipped to 0..100; readings
per device are equal, or uniform from a quarter to seven quarters of their mean. Every
reading is privatized with ``Zeal.perturb`` and decoded, as the server sees it. Under the
alternative, group A's device levels are shifted by ``shift``. A faulty fleet's group A has
one device that reports the top of the range for every reading.

The truth a method is judged against is its own estimand (``zeal.compare.estimand``):
the method's statistic of the two groups' populations, computed once per fleet from
``POPULATION`` simulated devices per group (privatized like the rest; a faulty group holds
its faulty device in the same share as in the fleet). With no shift and no fault both
groups are one population, so every estimand is 0 and no computation is needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from zeal import ParameterError, Zeal
from zeal.censored import censored_normal_mle, censoring_count
from zeal.compare import (
    Comparison,
    Partitions,
    censored,
    cluster_weighted,
    device_means,
    trimmed,
    winsorized,
)

__all__ = ["METHODS", "Fleet", "Tally", "estimands", "fleets", "run"]

UPPER = 100.0
ZERO_SHARE = 0.4
#: Devices per group in the population an estimand is computed from.
POPULATION = 20_000
#: Device-mean (estimator, population statistic) per method: the statistic maps a group's
#: counts and decoded sums to the group's value of the method's estimand.
METHODS: dict[str, Callable[[Partitions, Partitions], Comparison]] = {
    "cluster": cluster_weighted,
    "device_means": device_means,
    "trimmed": trimmed,
    "winsorized": winsorized,
    "censored": censored,
}


@dataclass(frozen=True)
class Fleet:
    devices: int  # per group
    epsilon: float
    equal: bool  # every device sends the same number of readings
    shape: str  # of the device means: "lognormal" or "normal"
    faulty: bool = False
    readings: int = 48  # per device (their mean when unequal)

    @property
    def name(self) -> str:
        return (
            f"{self.devices} devices, eps {self.epsilon:g}, "
            f"{'equal' if self.equal else 'unequal'} readings, {self.shape}"
            + (", 1 faulty" if self.faulty else "")
        )

    @property
    def shift(self) -> float:
        """The alternative: a shift of group A's device levels that a 30-device fleet
        detects about half the time or more."""
        return 8.0 if self.shape == "lognormal" else 6.0


def fleets() -> list[Fleet]:
    """The matrix: 10 and 30 devices per group, epsilon 1 and 4, equal and unequal readings
    per device, lognormal and normal device means; and one faulty device in each."""
    return [
        Fleet(devices, epsilon, equal, shape, faulty)
        for faulty in (False, True)
        for shape in ("lognormal", "normal")
        for devices in (10, 30)
        for epsilon in (1.0, 4.0)
        for equal in (False, True)
    ]


def levels(rng: np.random.Generator, fleet: Fleet, size: int) -> npt.NDArray[np.float64]:
    """Device levels (their expected reading before clipping)."""
    if fleet.shape == "lognormal":
        return 2.0 + rng.lognormal(math.log(15.0), 0.8, size)
    return np.clip(rng.normal(35.0, 10.0, size), 1.0, None)


def group(
    rng: np.random.Generator,
    params: Zeal,
    fleet: Fleet,
    size: int,
    *,
    shift: float = 0.0,
    faulty: int = 0,
) -> Partitions:
    """`size` devices' partitions (readings, sum of decoded values); the first `faulty`
    devices report the top of the range."""
    r = fleet.readings
    counts = (
        np.full(size, r, dtype=np.int64)
        if fleet.equal
        else rng.integers(r // 4, 7 * r // 4 + 1, size=size)
    )
    level = np.repeat(levels(rng, fleet, size) + shift, counts)
    total = int(counts.sum())
    positive = rng.gamma(2.0, level / (2.0 * (1 - ZERO_SHARE)), total)
    raw = np.clip(np.where(rng.random(total) < ZERO_SHARE, 0.0, positive), 0.0, UPPER)
    if faulty:
        raw[: int(counts[:faulty].sum())] = UPPER
    decoded = params.decode(params.perturb(raw, rng=rng))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return Partitions.of(counts, np.add.reduceat(decoded, starts))


def _statistic(method: str, g: Partitions, fleet: Fleet) -> float:
    """One group's value of a method's estimand, from a population of its devices: the
    robust methods cut the same share as in a fleet of `fleet.devices`."""
    share = censoring_count(fleet.devices, 0.1) / fleet.devices
    if method == "cluster":
        return float(g.sums.sum() / g.counts.sum())
    x = np.sort(g.means)
    if method == "device_means":
        return float(x.mean())
    k = round(share * x.size)
    if method == "trimmed":
        return float(x[k : x.size - k].mean())
    if method == "winsorized":
        return float(np.clip(x, x[k], x[x.size - k - 1]).mean())
    return censored_normal_mle(x, share)[0]


def estimands(fleet: Fleet, seed: int) -> dict[str, tuple[float, float]]:
    """(under the null, under the shift) per method: A's value minus B's, from populations
    of POPULATION devices per group."""
    params = Zeal(lower=0.0, upper=UPPER, epsilon=fleet.epsilon)
    rng = np.random.default_rng(seed)
    faulty = round(POPULATION / fleet.devices) if fleet.faulty else 0
    b = group(rng, params, fleet, POPULATION)
    a0 = group(rng, params, fleet, POPULATION, faulty=faulty) if fleet.faulty else None
    a1 = group(rng, params, fleet, POPULATION, shift=fleet.shift, faulty=faulty)
    out = {}
    for method in METHODS:
        base = _statistic(method, b, fleet)
        null = 0.0 if a0 is None else _statistic(method, a0, fleet) - base
        out[method] = (null, _statistic(method, a1, fleet) - base)
    return out


@dataclass
class Tally:
    """Counts over repetitions for one method and fleet."""

    reps: int = 0
    rejected_null: int = 0  # p < 0.05 with no shift
    covered_null: int = 0  # the 95 % interval holds the estimand with no shift
    rejected_shift: int = 0  # power
    covered_shift: int = 0
    refused: int = 0  # no answer (a ParameterError, e.g. too few devices for the method)

    def add(
        self, null: Comparison | None, shifted: Comparison | None, truth: tuple[float, float]
    ) -> None:
        self.reps += 1
        if null is None or shifted is None:
            self.refused += 1
            return
        self.rejected_null += null.p_value < 0.05
        self.covered_null += null.ci[0] <= truth[0] <= null.ci[1]
        self.rejected_shift += shifted.p_value < 0.05
        self.covered_shift += shifted.ci[0] <= truth[1] <= shifted.ci[1]

    @staticmethod
    def rate(count: int, reps: int) -> tuple[float, float]:
        """(rate, its Monte Carlo standard error)."""
        p = count / reps
        return p, math.sqrt(max(p * (1 - p), 1e-12) / reps)


def _answer(method: str, a: Partitions, b: Partitions) -> Comparison | None:
    try:
        return METHODS[method](a, b)
    except ParameterError:
        return None


def run(
    fleet: Fleet, reps: int, seed: int, methods: tuple[str, ...] = tuple(METHODS)
) -> tuple[dict[str, Tally], dict[str, tuple[float, float]]]:
    """`reps` seeded repetitions of `fleet`: each draws a null fleet (both groups from one
    population, A with its faulty device if any) and a shifted one, and asks every method."""
    truths = estimands(fleet, seed + 1)
    params = Zeal(lower=0.0, upper=UPPER, epsilon=fleet.epsilon)
    rng = np.random.default_rng(seed)
    tallies = {m: Tally() for m in methods}
    faulty = 1 if fleet.faulty else 0
    for _ in range(reps):
        b0, b1 = (group(rng, params, fleet, fleet.devices) for _ in range(2))
        a0 = group(rng, params, fleet, fleet.devices, faulty=faulty)
        a1 = group(rng, params, fleet, fleet.devices, shift=fleet.shift, faulty=faulty)
        for method in methods:
            tallies[method].add(_answer(method, a0, b0), _answer(method, a1, b1), truths[method])
    return tallies, truths
