"""Comparing two groups on a real fleet: inference on partition statistics (paper 003).

Readings of one device are correlated (a house with electric heating draws more than one
without), so a standard error that treats every reading as independent is far too small.
Paper 003 partitions the data, takes one statistic per partition, and treats the
partition statistics as the independent units. In the local model its sanitization steps
are unnecessary: every reading is already private, and what the server computes from the
codes is post-processing. Its statistics are what this module provides.

Input is one row per partition: how many readings it holds and the sum of their decoded
values (``Zeal.decode`` summed, or AVG* times n from exact code sums). Partitions are
devices, or (for :func:`paired_blocks`) time blocks in which both groups were observed.

Methods (each returns a :class:`Comparison`):

- :func:`cluster_weighted`: the reading-weighted mean difference, with a cluster-robust
  (device-level, CR1) standard error and Satterthwaite degrees of freedom;
- :func:`device_means`: the difference of the mean of device means (Welch);
- :func:`paired_blocks`: paper 003's z_j, the difference of the groups' means in time
  block j, with a one-sample t on P - 1 degrees of freedom (Eq. (8)-(9): the PnoC data);
- :func:`trimmed`: the device means of both groups cut at their pooled sample quantiles
  (paper 003 Eqs. (26)-(27)), or the paired block differences trimmed (Yuen);
- :func:`winsorized`: the winsorized means of the partition statistics (paper 003
  Eqs. (22)-(25), Yuen's two-sample form for device means);
- :func:`censored`: the normal MLE of the partition statistics doubly censored at their
  sample quantiles (paper 003 Eq. (14)), its standard error from the observed
  information.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from zeal.censored import censored_normal_mle
from zeal.errors import ParameterError
from zeal.estimate import check_confidence
from zeal.studentt import t_quantile, two_sided_p

__all__ = [
    "FEW_PARTITIONS",
    "Comparison",
    "Partitions",
    "censored",
    "cluster_weighted",
    "device_means",
    "paired_blocks",
    "trimmed",
    "winsorized",
]

#: Below this many partitions in a group, a comparison carries a warning.
FEW_PARTITIONS: Final = 10
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
    warnings: tuple[str, ...] = field(default=())


def _result(
    method: str,
    estimate: float,
    variance: float,
    df: float,
    *,
    confidence: float,
    groups: tuple[Partitions, Partitions],
    warnings: list[str],
) -> Comparison:
    level = check_confidence(confidence)
    se = math.sqrt(max(variance, 0.0))
    half = t_quantile(level, df) * se
    p = two_sided_p(estimate / se, df) if se > 0 else (1.0 if estimate == 0 else 0.0)
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
    found_a, found_b = _one_sample(a.means), _one_sample(b.means)
    return _difference(
        "device_means", a, b, found_a, found_b, confidence=confidence, warnings=warnings
    )


def _one_sample(z: _F64) -> tuple[float, float, float]:
    return float(z.mean()), float(np.var(z, ddof=1)) / z.size, z.size - 1.0


def paired_blocks(
    a: Partitions, b: Partitions, *, confidence: float = 0.95, warnings: list[str] | None = None
) -> Comparison:
    """Paper 003's partition statistic: z_j = mean of A minus mean of B in time block j
    (rows of `a` and `b` are the same blocks), a one-sample t on P - 1 degrees of freedom.
    Warns when the z_j are strongly autocorrelated at lag 1 (blocks too short to be
    independent)."""
    if len(a) != len(b):
        raise ParameterError(
            f"paired blocks need the same blocks in both groups ({len(a)}, {len(b)})"
        )
    _need(a, "A", 3)
    z = a.means - b.means
    estimate, variance, df = _one_sample(z)
    notes = list(warnings or [])
    rho = lag1_autocorrelation(z)
    if rho > 0.5:
        notes.append(
            f"the block differences are autocorrelated (lag-1 r = {rho:.2f}): use longer "
            "blocks, or the standard error is too small"
        )
    return _result(
        "paired_blocks",
        estimate,
        variance,
        df,
        confidence=confidence,
        groups=(a, b),
        warnings=notes,
    )


def lag1_autocorrelation(z: _F64) -> float:
    """The lag-1 autocorrelation of a series (0 for fewer than 3 values or no spread)."""
    if z.size < 3:
        return 0.0
    centred = z - z.mean()
    denominator = float(centred @ centred)
    return float(centred[1:] @ centred[:-1]) / denominator if denominator > 0 else 0.0


def _trim_count(size: int, proportion: float) -> int:
    if not 0.0 <= proportion < 0.5:
        raise ParameterError(f"the trimming proportion must be in [0, 0.5), got {proportion!r}")
    return math.floor(proportion * size)


def _winsorize(x: _F64, k: int) -> _F64:
    ordered = np.sort(x)
    if k == 0:
        return ordered
    return np.clip(ordered, ordered[k], ordered[-k - 1])


def _yuen(x: _F64, proportion: float, *, trim: bool) -> tuple[float, float, float]:
    """(robust mean, its squared standard error, degrees of freedom) of one sample, with
    k = floor(proportion * n) values cut or pulled in at each end, h = n - 2k kept and the
    winsorized variance s_w**2 (paper 003 Eqs. (22)-(25)): Yuen's trimmed mean,
    (n - 1) s_w**2 / (h (h - 1)), or the winsorized mean, s_w**2 (n - 1)**2 / ((h - 1)**2 n);
    both on h - 1 degrees of freedom."""
    n = x.size
    k = _trim_count(n, proportion)
    h = n - 2 * k
    if h < 2:
        raise ParameterError(f"cutting {proportion} of {n} partitions at each end leaves {h}")
    ordered = np.sort(x)
    w = _winsorize(x, k)
    spread = float(np.var(w, ddof=1))
    if trim:
        return float(ordered[k : n - k].mean()), (n - 1) * spread / (h * (h - 1)), h - 1.0
    return float(w.mean()), spread * (n - 1) ** 2 / ((h - 1) ** 2 * n), h - 1.0


#: A one-sample estimator: values -> (centre, squared standard error, degrees of freedom).
_OneSample = Callable[[_F64], tuple[float, float, float]]


def _robust(
    method: str,
    a: Partitions,
    b: Partitions,
    estimator: _OneSample,
    *,
    paired: bool,
    confidence: float,
) -> Comparison:
    """A one-sample estimator applied to the paired block differences, or to each group's
    device means (the difference then has Satterthwaite's degrees of freedom)."""
    if not paired:
        found_a, found_b = estimator(a.means), estimator(b.means)
        return _difference(method, a, b, found_a, found_b, confidence=confidence)
    if len(a) != len(b):
        raise ParameterError("paired blocks need the same blocks in both groups")
    centre, variance, df = estimator(a.means - b.means)
    groups = (a, b)
    return _result(
        f"{method}_blocks", centre, variance, df, confidence=confidence, groups=groups, warnings=[]
    )


def _difference(
    method: str,
    a: Partitions,
    b: Partitions,
    found_a: tuple[float, float, float],
    found_b: tuple[float, float, float],
    *,
    confidence: float,
    warnings: list[str] | None = None,
) -> Comparison:
    """A minus B from each group's (centre, squared SE, df); Satterthwaite's df."""
    (ca, va, dfa), (cb, vb, dfb) = found_a, found_b
    df = _satterthwaite(va, dfa, vb, dfb)
    notes = warnings or []
    return _result(
        method, ca - cb, va + vb, df, confidence=confidence, groups=(a, b), warnings=notes
    )


def trimmed(
    a: Partitions,
    b: Partitions,
    *,
    proportion: float = 0.1,
    paired: bool = False,
    confidence: float = 0.95,
) -> Comparison:
    """The trimmed mean of the partition statistics. Device means: the `proportion` largest
    and smallest of both groups together are dropped, then each group's kept devices are
    averaged (:func:`_cut_at_pooled_quantiles`). Paired block differences: the one-sample
    trimmed mean with the winsorized variance (Yuen)."""

    def estimator(x: _F64) -> tuple[float, float, float]:
        return _yuen(x, proportion, trim=True)

    if paired:
        return _robust("trimmed", a, b, estimator, paired=True, confidence=confidence)
    _need(a, "A")
    _need(b, "B")
    cut_a, cut_b = _cut_at_pooled_quantiles(a.means, b.means, proportion)
    return _difference("trimmed", a, b, cut_a, cut_b, confidence=confidence)


def _cut_at_pooled_quantiles(
    xa: _F64, xb: _F64, proportion: float
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """Each group's mean of the device means inside the cut points l and u, the pooled
    sample quantiles of both groups' device means (k = floor(proportion * n) of the n
    values outside at each end: paper 003's censoring of the partition statistics at their
    sample quantiles, the uncensored ones kept, Eqs. (26)-(27)); its squared standard error
    s_kept**2 / h and h - 1 degrees of freedom, h the group's kept devices.

    One cut for both groups is what makes this robust: a faulty device takes one of the k
    places at its end, and every genuine device of either group faces the same cut points,
    so the groups stay comparable (cutting each group at its own quantiles keeps one more
    genuine high device in the faulty group: docs/comparison.md). The standard error is
    conditional on the cut points, which both groups share."""
    pooled = np.sort(np.concatenate([xa, xb]))
    k = _trim_count(pooled.size, proportion)
    low, high = pooled[k], pooled[pooled.size - k - 1]
    found = []
    for name, x in (("A", xa), ("B", xb)):
        kept = x[(x >= low) & (x <= high)]
        if kept.size < 2:
            raise ParameterError(
                f"group {name} keeps {kept.size} device(s) inside the pooled cut points"
            )
        found.append((float(kept.mean()), float(np.var(kept, ddof=1)) / kept.size, kept.size - 1.0))
    return found[0], found[1]


def winsorized(
    a: Partitions,
    b: Partitions,
    *,
    proportion: float = 0.1,
    paired: bool = False,
    confidence: float = 0.95,
) -> Comparison:
    """The winsorized mean of the partition statistics: the `proportion` largest and
    smallest are set to the nearest kept value."""

    def estimator(x: _F64) -> tuple[float, float, float]:
        return _yuen(x, proportion, trim=False)

    return _robust("winsorized", a, b, estimator, paired=paired, confidence=confidence)


def censored(
    a: Partitions,
    b: Partitions,
    *,
    proportion: float = 0.1,
    paired: bool = False,
    confidence: float = 0.95,
) -> Comparison:
    """The censored normal MLE of the partition statistics (device means per group, or the
    paired block differences; :mod:`zeal.censored`), its standard error from the observed
    information, and a t reference on the uncensored partitions less one."""

    def estimator(x: _F64) -> tuple[float, float, float]:
        return censored_normal_mle(x, proportion)

    return _robust("censored", a, b, estimator, paired=paired, confidence=confidence)
