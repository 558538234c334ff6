"""Comparing two groups on a real fleet: inference on partition statistics (paper 003).

Readings of one device are correlated (a house with electric heating draws more than one
without), so a standard error that treats every reading as independent is far too small.
Paper 003 partitions the data, takes one statistic per partition, and treats the
partition statistics as the independent units. In the local model its sanitization steps
are unnecessary: every reading is already private, and what the server computes from the
codes is post-processing. Its statistics are what this module provides.

Input is one row per partition: how many readings it holds and the sum of their decoded
values (``Zeal.decode`` summed, or AVG* times n from exact code sums). Partitions are
devices: disjoint sets of readings, as paper 003's partitions are disjoint sets of
individuals. (Time blocks holding the same devices are not: each device's effect enters
every block, so block differences are not independent; the paired-blocks methods were
withdrawn for that, docs/comparison.md.)

Methods (each returns a :class:`Comparison`, which names its estimand):

- :func:`cluster_weighted`: the reading-weighted mean difference, with a cluster-robust
  (device-level, CR1) standard error and Satterthwaite degrees of freedom;
- :func:`device_means`: the difference of the mean of device means (Welch);
- :func:`trimmed`: the difference of the groups' trimmed means of device means (Yuen,
  paper 003 Eqs. (26)-(27));
- :func:`winsorized`: the difference of the groups' winsorized means of device means
  (paper 003 Eqs. (22)-(25), Yuen's two-sample form);
- :func:`censored`: the difference of the locations of normal fits to each group's device
  means doubly censored at their sample quantiles (paper 003 Eq. (14)), the standard error
  from the observed information.

The robust methods cut k = round(P * proportion) of a group's P device means at each end
(:func:`zeal.censored.censoring_count`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from zeal._core.studentt import t_quantile, two_sided_p
from zeal.censored import censored_normal_mle, censoring_count
from zeal.errors import ParameterError
from zeal.estimate import check_confidence

__all__ = [
    "CENSORED_LEAST",
    "FEW_PARTITIONS",
    "Comparison",
    "Partitions",
    "censored",
    "cluster_weighted",
    "device_means",
    "estimand",
    "trimmed",
    "winsorized",
]

#: Below this many partitions in a group, a comparison carries a warning.
FEW_PARTITIONS: Final = 10
#: The censored fit is offered from this many partitions per group: below it the observed
#: information overstates the variance (by 15 % at 10 partitions) and the test rejects at
#: 0.02-0.035 for a nominal 0.05 (bench/VALIDITY.md).
CENSORED_LEAST: Final = 30
_F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Partitions:
    """One group's partitions: readings and the sum of their decoded values, per partition."""

    counts: npt.NDArray[np.int64]
    sums: _F64

    @classmethod
    def of(cls, counts: npt.ArrayLike, sums: npt.ArrayLike) -> Partitions:
        n = np.asarray(counts, dtype=np.int64).ravel()
        s = np.asarray(sums, dtype=np.float64).ravel()
        if n.size != s.size:
            raise ParameterError(f"{n.size} counts but {s.size} sums")
        if n.size and int(n.min()) < 1:
            raise ParameterError("every partition must hold at least one reading")
        if not np.all(np.isfinite(s)):
            raise ParameterError("partition sums must be finite")
        return cls(n, s)

    @property
    def means(self) -> _F64:
        means: _F64 = self.sums / self.counts
        return means

    def __len__(self) -> int:
        return int(self.counts.size)


@dataclass(frozen=True)
class Comparison:
    """Group A minus group B, with its inference."""

    method: str
    difference: float
    std_error: float
    df: float
    ci: tuple[float, float]
    p_value: float
    confidence: float
    partitions: tuple[int, int]
    smallest: tuple[int, int]  # readings in each group's smallest partition
    median: tuple[float, float]  # and in its median partition
    #: What `difference` estimates, in words (:func:`estimand`).
    estimand: str = ""
    warnings: tuple[str, ...] = field(default=())


def estimand(method: str, lower: float = 0.1, upper: float | None = None) -> str:
    """What a method's `difference` estimates, in words, with whether it is the difference
    of the groups' means (`lower`/`upper`: the robust methods' cut proportions)."""
    upper = lower if upper is None else upper
    cut = f"{lower:g}" if lower == upper else f"{lower:g} (low end), {upper:g} (high end)"
    not_means = (
        ": not the difference of the groups' means unless their device means are "
        "symmetrically distributed"
    )
    return {
        "reading": "difference of the groups' reading-weighted means (every reading as an "
        "independent unit)",
        "cluster": "difference of the groups' reading-weighted means (every reading counts "
        "once; devices are the independent units)",
        "device_means": "difference of the groups' means of device means (every device "
        "counts once)",
        "trimmed": f"difference of the groups' {cut}-trimmed means of device means{not_means}",
        "winsorized": f"difference of the groups' {cut}-winsorized means of device means"
        f"{not_means}",
        "censored": "difference of the locations (mu) of normal distributions fitted to each "
        f"group's device means censored at their {cut} sample quantiles{not_means} "
        "(and normal)",
    }[method]


def _result(
    method: str,
    estimate: float,
    variance: float,
    df: float,
    *,
    confidence: float,
    groups: tuple[Partitions, Partitions],
    warnings: list[str],
    described: str,
) -> Comparison:
    level = check_confidence(confidence)
    if not (math.isfinite(variance) and variance > 0 and math.isfinite(estimate)):
        raise ParameterError(
            f"the {method} comparison has no finite, positive variance (every partition "
            "statistic equal?): no standard error"
        )
    se = math.sqrt(variance)
    half = t_quantile(level, df) * se
    p = two_sided_p(estimate / se, df)
    for name, group in zip("AB", groups, strict=True):
        if len(group) < FEW_PARTITIONS:
            warnings.append(
                f"group {name} has {len(group)} partitions (fewer than {FEW_PARTITIONS}): the "
                "t approximation and the standard error are rough"
            )
    return Comparison(
        method=method,
        difference=estimate,
        std_error=se,
        df=df,
        ci=(estimate - half, estimate + half),
        p_value=p,
        confidence=level,
        partitions=(len(groups[0]), len(groups[1])),
        smallest=(int(groups[0].counts.min()), int(groups[1].counts.min())),
        median=(float(np.median(groups[0].counts)), float(np.median(groups[1].counts))),
        estimand=described,
        warnings=tuple(warnings),
    )


def _need(group: Partitions, name: str, least: int = 2) -> None:
    if len(group) < least:
        raise ParameterError(f"group {name} needs at least {least} partitions, has {len(group)}")


def _satterthwaite(va: float, dfa: float, vb: float, dfb: float) -> float:
    """Welch-Satterthwaite degrees of freedom of va + vb."""
    denominator = va * va / dfa + vb * vb / dfb
    return (va + vb) ** 2 / denominator if denominator > 0 else dfa + dfb


def cluster_weighted(
    a: Partitions, b: Partitions, *, confidence: float = 0.95, warnings: list[str] | None = None
) -> Comparison:
    """Reading-weighted means (every reading counts once), devices as the independent
    units: the variance of each group's mean is the CR1 cluster-robust sandwich
    G / (G - 1) * sum_i (s_i - n_i m)**2 / N**2, and the degrees of freedom are
    Satterthwaite's over G_A - 1 and G_B - 1."""
    _need(a, "A")
    _need(b, "B")
    parts = []
    for group in (a, b):
        total = float(group.counts.sum())
        mean = float(group.sums.sum()) / total
        residual = group.sums - group.counts * mean
        g = len(group)
        parts.append((mean, g / (g - 1) * float(residual @ residual) / (total * total), g - 1))
    return _difference(
        "cluster", a, b, parts[0], parts[1], confidence=confidence, warnings=warnings
    )


def device_means(
    a: Partitions, b: Partitions, *, confidence: float = 0.95, warnings: list[str] | None = None
) -> Comparison:
    """The mean of device means in each group (every device counts once), Welch's t."""
    _need(a, "A")
    _need(b, "B")
    found = [_one_sample(g.means) for g in (a, b)]
    return _difference(
        "device_means", a, b, found[0], found[1], confidence=confidence, warnings=warnings
    )


def _one_sample(z: _F64) -> tuple[float, float, float]:
    return float(z.mean()), float(np.var(z, ddof=1)) / z.size, z.size - 1.0


def _yuen(x: _F64, proportion: float, *, trim: bool) -> tuple[float, float, float]:
    """(robust mean, its squared standard error, degrees of freedom) of one sample, with
    k = round(proportion * n) values cut or pulled in at each end, h = n - 2k kept and the
    winsorized variance s_w**2 (paper 003 Eqs. (22)-(27)): Yuen's trimmed mean,
    (n - 1) s_w**2 / (h (h - 1)), or the winsorized mean, s_w**2 (n - 1)**2 / ((h - 1)**2 n);
    both on h - 1 degrees of freedom."""
    n = x.size
    k = censoring_count(n, proportion)
    h = n - 2 * k
    if h < 2:
        raise ParameterError(f"cutting {k} of {n} partitions at each end leaves {h}")
    ordered = np.sort(x)
    w = np.clip(ordered, ordered[k], ordered[n - k - 1])
    spread = float(np.var(w, ddof=1))
    if trim:
        return float(ordered[k : n - k].mean()), (n - 1) * spread / (h * (h - 1)), h - 1.0
    return float(w.mean()), spread * (n - 1) ** 2 / ((h - 1) ** 2 * n), h - 1.0


def _difference(
    method: str,
    a: Partitions,
    b: Partitions,
    found_a: tuple[float, float, float],
    found_b: tuple[float, float, float],
    *,
    confidence: float,
    warnings: list[str] | None = None,
    described: str | None = None,
) -> Comparison:
    """A minus B from each group's (centre, squared SE, df); Satterthwaite's df."""
    (ca, va, dfa), (cb, vb, dfb) = found_a, found_b
    df = _satterthwaite(va, dfa, vb, dfb)
    return _result(
        method,
        ca - cb,
        va + vb,
        df,
        confidence=confidence,
        groups=(a, b),
        warnings=list(warnings or []),
        described=described or estimand(method),
    )


def trimmed(
    a: Partitions, b: Partitions, *, proportion: float = 0.1, confidence: float = 0.95
) -> Comparison:
    """Yuen's two-sample trimmed means: each group's device means with the k = round(P *
    `proportion`) largest and smallest of its own P dropped, the winsorized variance
    (paper 003 Eqs. (26)-(27)). Its estimand is the difference of the groups' trimmed
    means, the difference of means only where device means are symmetric. (Cutting both
    groups at pooled quantiles, as this did before, estimated neither: under a shift of
    skewed device means it reported about half the shift.)"""
    return _robust("trimmed", a, b, proportion, confidence)


def winsorized(
    a: Partitions, b: Partitions, *, proportion: float = 0.1, confidence: float = 0.95
) -> Comparison:
    """The groups' winsorized means of device means: each group's k = round(P *
    `proportion`) largest and smallest set to the nearest kept value (paper 003 Eqs.
    (22)-(25), Yuen's variance)."""
    return _robust("winsorized", a, b, proportion, confidence)


def _robust(
    method: str, a: Partitions, b: Partitions, proportion: float, confidence: float
) -> Comparison:
    """Yuen's two-sample form of the trimmed or winsorized means of device means."""
    _need(a, "A")
    _need(b, "B")
    found = [_yuen(g.means, proportion, trim=method == "trimmed") for g in (a, b)]
    described = estimand(method, proportion)
    return _difference(method, a, b, found[0], found[1], confidence=confidence, described=described)


def censored(
    a: Partitions,
    b: Partitions,
    *,
    proportion: float = 0.1,
    upper: float | None = None,
    confidence: float = 0.95,
) -> Comparison:
    """The censored normal MLE of each group's device means (:mod:`zeal.censored`): k_l =
    round(P * `proportion`) censored at the low end and k_u = round(P * `upper`) at the high
    end (`upper` defaults to `proportion`; paper 003's alpha and beta), the standard error
    from the observed information, a t reference on the kept partitions less one. Offered
    from CENSORED_LEAST partitions per group."""
    _need(a, "A", CENSORED_LEAST)
    _need(b, "B", CENSORED_LEAST)
    found = [censored_normal_mle(g.means, proportion, upper) for g in (a, b)]
    return _difference(
        "censored",
        a,
        b,
        found[0],
        found[1],
        confidence=confidence,
        described=estimand("censored", proportion, upper),
    )
