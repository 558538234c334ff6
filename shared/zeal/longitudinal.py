"""Longitudinal streams: a device's loss bounded by the values it visits, not by how often it
reports (memoization; Ding, Kulkarni and Yekhanin, "Collecting Telemetry Data Privately",
NeurIPS 2017: alpha-point rounding and memoization).

A stream with ``grid_points`` K (a :class:`zeal.Zeal` parameter, in its configuration and
fingerprint) is longitudinal. Each device

1. draws a secret **offset** ``a`` uniform on [0, 1) once (53 random bits);
2. rounds every reading (clipped to the range) to the **grid** ``g_j = lower + j * step``,
   ``step = (upper - lower) / (K - 1)``, ``j = 0 .. K-1`` (each operation in float64, as the
   firmware's integer binary64 does it): with ``j`` the last grid index with ``g_j <= x``
   (at most K-2), the reading goes up to ``g_(j+1)`` when ``a * (g_(j+1) - g_j) < x - g_j``
   (float64 products and differences), else to ``g_j``. Over the offset that happens with
   probability ``(x - g_j) / (g_(j+1) - g_j)`` (to float rounding), so the grid value is an
   unbiased estimate of the reading (alpha-point rounding). For a fixed offset the rounding
   is deterministic and monotone: a device whose reading does not change sends one value;
3. sends, for grid value ``j``, the Zeal code it drew the **first** time it met ``j``
   (``Zeal.perturb(g_j)``, at the stream's epsilon), and that same code every later time.

The offset and the memo table never leave the device (:class:`Memo`'s repr shows neither).
What it costs (docs/privacy.md, "Longitudinal streams", states it as a theorem): for two
value histories that agree outside a horizon H and that share their *pattern* (which
reports carry the same grid value), every report sequence's likelihood ratio is at most
``(w_hi / w_lo) ** m``, m the number of grid values first drawn within H: at most
``m * realized_epsilon``. A draw is booked when it is made; a repeat costs nothing. The
pattern itself (when the rounded value changes) is not protected: :func:`audit_memo` checks
both statements exactly on small grids.

Estimates (:func:`clustered_estimate`): each code decodes to an unbiased estimate of its
reading (over the device's offset and draws), so every average stays unbiased; but the codes
of one device repeat, so the standard error comes from devices (cluster-robust, CR1 with
D - 1 degrees of freedom) and the guaranteed interval from Bernstein's inequality over
devices (a device of n readings moves the sum by at most n (M + step)).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

import numpy as np
import numpy.typing as npt

from zeal._core.mechanism import Zeal
from zeal._core.randomness import Randomness, random_words
from zeal._core.studentt import t_quantile
from zeal.errors import ParameterError
from zeal.estimate import Estimate, check_confidence, cut
from zeal.protocol import GRID_POINTS

__all__ = [
    "MEMO_FORMAT",
    "GridPlan",
    "Memo",
    "MemoAudit",
    "Reports",
    "audit_memo",
    "clustered_estimate",
    "draw_offset",
    "grid_indices",
    "grid_step",
    "grid_values",
    "lifetime_bound",
    "loss",
    "plan_grid",
    "simulate_fleet",
]

_F64 = npt.NDArray[np.float64]
_I64 = npt.NDArray[np.int64]
#: The format of a memo table as the agent keeps it (Memo.to_json).
MEMO_FORMAT: Final = "zeal-memo/1"


def _points(params: Zeal) -> int:
    if params.grid_points is None:
        raise ParameterError("this stream is not longitudinal (it has no grid_points)")
    return params.grid_points


def grid_step(params: Zeal) -> float:
    """The grid's spacing, ``(upper - lower) / (K - 1)`` in float64."""
    return (params.upper - params.lower) / (_points(params) - 1)


def grid_values(params: Zeal) -> _F64:
    """The K grid values ``lower + j * step``, each operation in float64."""
    return params.lower + np.arange(_points(params), dtype=np.float64) * grid_step(params)


def draw_offset(rng: Randomness = None) -> float:
    """A device's secret offset: 53 random bits as a float in [0, 1) (the OS CSPRNG unless
    a seeded generator is given, tests only)."""
    return float(random_words(rng, 1)[0] >> np.uint64(11)) * 2.0**-53


def _check_offset(offset: float) -> float:
    if isinstance(offset, bool) or not isinstance(offset, int | float):
        raise ParameterError(f"a memo offset must be a number in [0, 1), got {offset!r}")
    if not 0.0 <= float(offset) < 1.0:
        raise ParameterError(f"a memo offset must be in [0, 1), got {offset!r}")
    return float(offset)


def grid_indices(params: Zeal, readings: npt.ArrayLike, offset: float) -> _I64:
    """The grid index each reading rounds to under `offset` (alpha-point rounding; module
    docstring). Readings are clipped to the range first, as the mechanism clips them."""
    values = grid_values(params)
    x = np.clip(np.asarray(readings, dtype=np.float64).ravel(), params.lower, params.upper)
    j = np.clip(np.searchsorted(values, x, side="right") - 1, 0, values.size - 2)
    width = values[j + 1] - values[j]
    up = _check_offset(offset) * width < x - values[j]
    return (j + up).astype(np.int64)


@dataclass(frozen=True)
class Reports:
    """What a device sends for some readings: ``codes``, and ``fresh`` (True where that
    reading made a new draw: the ones its ledger books)."""

    codes: npt.NDArray[np.uint64]
    fresh: npt.NDArray[np.bool_]

    @property
    def draws(self) -> int:
        return int(self.fresh.sum())


class Memo:
    """One device's secret for one longitudinal stream: its offset and the code it drew for
    each grid value it met. Never logged: the repr shows only how many values were drawn.

    ``key`` names the mechanism the codes were drawn with (range, epsilon, width, grid);
    a memo of another key must not be used (the agent starts a new one, booked as new
    draws)."""

    __slots__ = ("codes", "key", "offset")

    def __init__(self, key: str, offset: float, codes: dict[int, int] | None = None) -> None:
        self.key = key
        self.offset = _check_offset(offset)
        self.codes: dict[int, int] = dict(codes or {})

    @staticmethod
    def key_of(params: Zeal) -> str:
        """What a memo is valid for: the mechanism and the grid, not the policy."""
        return (
            f"{params.lower.hex()}|{params.upper.hex()}|{params.epsilon.hex()}|"
            f"{params.exponent}|{params.sampler}|{_points(params)}"
        )

    @classmethod
    def new(cls, params: Zeal, rng: Randomness = None) -> Memo:
        return cls(cls.key_of(params), draw_offset(rng))

    def __repr__(self) -> str:
        return f"Memo(<secret offset>, {len(self.codes)} grid values drawn)"

    def report(self, params: Zeal, readings: npt.ArrayLike, *, rng: Randomness = None) -> Reports:
        """The codes to send for `readings` (in order), drawing a code for each grid value
        met for the first time (at its first reading) and memoizing it."""
        if self.key != self.key_of(params):
            raise ParameterError("this memo was drawn for another mechanism or grid")
        index = grid_indices(params, readings, self.offset)
        fresh = np.zeros(index.size, dtype=bool)
        new = [j for j in dict.fromkeys(index.tolist()) if j not in self.codes]
        if new:
            drawn = params.perturb(grid_values(params)[new], rng=rng)
            for j, code in zip(new, drawn.tolist(), strict=True):
                self.codes[j] = int(code)
            firsts = {j: int(np.argmax(index == j)) for j in new}
            fresh[list(firsts.values())] = True
        lookup = np.zeros(_points(params), dtype=np.uint64)
        for j, code in self.codes.items():
            lookup[j] = code
        return Reports(lookup[index], fresh)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": MEMO_FORMAT,
                "key": self.key,
                "offset": self.offset.hex(),
                "codes": {str(j): c for j, c in sorted(self.codes.items())},
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Memo:
        try:
            data = json.loads(text)
            form = data.get("format")
            codes = {int(j): int(c) for j, c in data["codes"].items()}
            memo = cls(str(data["key"]), float.fromhex(data["offset"]), codes)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ParameterError(f"a stored memo table does not read: {exc}") from exc
        if form != MEMO_FORMAT:
            raise ParameterError(f"a stored memo table is not a {MEMO_FORMAT} document")
        return memo


def _per_code(params: Zeal) -> float:
    return params.epsilon if params.realized_epsilon is None else params.realized_epsilon


def loss(params: Zeal, draws: int) -> float:
    """The loss of `draws` memo draws (module docstring): draws times the realized
    epsilon of one code."""
    return draws * _per_code(params)


def lifetime_bound(params: Zeal) -> float:
    """What one device can ever spend on a longitudinal stream with its memo kept: one draw
    per grid value."""
    return loss(params, _points(params))


def clustered_estimate(
    params: Zeal,
    counts: Sequence[int],
    sum_codes: Sequence[int],
    *,
    confidence: float = 0.95,
) -> Estimate:
    """The average of a longitudinal stream's readings from each device's readings and
    exact sum of codes: AVG* (Eq. (15)) over all codes, with a standard error from devices
    (CR1: ``D/(D-1) * sum_d (S_d - mean n_d)**2``, over (sum n_d)**2) and a t interval with
    D - 1 degrees of freedom, and a guaranteed interval (Bernstein's inequality, as Theorem
    3 but over devices: a device of n readings moves the sum by at most ``n (M + step)``
    with variance at most ``n**2 (V + step**2 / 4)``). With one device the standard error
    is that bound's."""
    level = check_confidence(confidence)
    n_d = np.asarray(counts, dtype=np.int64)
    if n_d.size == 0 or int(n_d.sum()) < 1:
        raise ParameterError("cannot estimate a mean from zero codes")
    total = int(n_d.sum())
    sums = params.decoded_sums(list(counts), list(sum_codes))
    mean = params.mean_of_sums(total, int(sum(sum_codes)))
    step = grid_step(params)
    variance = params.variance_bound() + step * step / 4
    bound = params.error_bound() + step
    weight = float(np.sum(n_d.astype(np.float64) ** 2))
    devices = int(n_d.size)
    if devices > 1:
        resid = sums - mean * n_d
        std_error = math.sqrt(devices / (devices - 1) * float(resid @ resid)) / total
        half = t_quantile(level, devices - 1) * std_error
    else:
        std_error = math.sqrt(variance * weight) / total
        half = math.inf
    log_term = math.log(2.0 / (1.0 - level))
    a = log_term * bound * float(n_d.max()) / 3
    sure = (a + math.sqrt(a * a + 2 * log_term * variance * weight)) / total
    return Estimate(
        mean=mean,
        n=total,
        std_error=std_error,
        ci=cut(mean - half, mean + half, params.lower, params.upper),
        guaranteed=cut(mean - sure, mean + sure, params.lower, params.upper),
        in_range=params.lower <= mean <= params.upper,
        confidence=level,
    )


@dataclass(frozen=True)
class GridPlan:
    """What a grid of `points` values costs and gives (:func:`plan_grid`)."""

    points: int
    step: float
    #: Per draw: the realized epsilon of one code.
    per_draw: float
    #: Everything a device can spend with its memo kept (one draw per value).
    lifetime: float
    #: The readings' span over the horizon planned for (``span``).
    span: float
    #: Draws of a device whose readings span `span`: expected over the offset, and at most.
    expected_draws: float
    most_draws: int
    #: The rounding's standard deviation at worst (step / 2), and what it adds to one
    #: code's standard error at the middle of the range (a ratio, 1 = nothing).
    rounding_sd: float
    std_error_ratio: float

    @property
    def expected_loss(self) -> float:
        return self.expected_draws * self.per_draw


def plan_grid(
    params: Zeal, *, span: float, budget: float | None = None, points: int | None = None
) -> GridPlan:
    """A grid for a stream (its range and epsilon; any ``grid_points`` it has is replaced):
    `points` values, or with `budget` the most values whose expected loss for a device whose
    readings span `span` over the horizon stays within it.

    For a fixed offset the rounding is monotone and moves up by one value each time the
    reading crosses one of the thresholds ``g_j + a * step`` (spaced `step` apart), so a
    device whose readings stay within an interval of length `span` meets at most
    ``floor(span / step) + 2`` values, and ``1 + span / step`` on average over its offset.
    """
    span = float(span)
    if not (math.isfinite(span) and span >= 0):
        raise ParameterError(f"span must be a finite number >= 0, got {span!r}")
    width = params.upper - params.lower
    per_draw = _per_code(params)
    if points is None:
        if budget is None:
            raise ParameterError("give points, or a budget to choose them by")
        if not (math.isfinite(budget) and budget >= per_draw):
            raise ParameterError(f"budget must allow one draw ({per_draw:g}), got {budget!r}")
        draws = budget / per_draw
        least, largest = GRID_POINTS
        most = largest if span == 0 else int(1 + (draws - 1) * width / span)
        points = max(least, min(largest, most))
    plan = Zeal(
        lower=params.lower,
        upper=params.upper,
        epsilon=params.epsilon,
        exponent=params.exponent,
        sampler=params.sampler,
        grid_points=points,
    )
    step = grid_step(plan)
    middle = params.variance((params.lower + params.upper) / 2)
    return GridPlan(
        points=points,
        step=step,
        per_draw=per_draw,
        lifetime=lifetime_bound(plan),
        span=span,
        expected_draws=min(float(points), 1 + span / step),
        most_draws=min(points, math.floor(span / step) + 2),
        rounding_sd=step / 2,
        std_error_ratio=math.sqrt(1 + step * step / 4 / middle),
    )


@dataclass(frozen=True)
class MemoAudit:
    """The exact check of a memo's accounting on every pair of histories of `times` reports
    over a `points`-value grid (:func:`audit_memo`)."""

    points: int
    times: int
    outputs: int
    pairs: int
    sequences: int
    #: The largest ln(ratio / bound) over every same-pattern pair and report sequence,
    #: the bound being (w_hi/w_lo) ** (draws within the horizon where the pair differs):
    #: at most 0 when the accounting holds (exact rationals, so exactly).
    worst_excess: float
    #: The largest loss met, in units of one code's realized epsilon (tightness).
    worst_loss_in_draws: float
    #: Same-pattern pairs with a report one history can give and the other cannot.
    holes: int
    #: Pairs with the same number of values but another pattern that some report tells
    #: apart with certainty: what the timing of changes reveals.
    pattern_pairs: int
    pattern_revealed: int

    @property
    def holds(self) -> bool:
        return self.worst_excess <= 0 and self.holes == 0

    def __str__(self) -> str:
        verdict = "HOLDS" if self.holds else "FAILS"
        return (
            f"memo accounting {verdict}: {self.pairs:,} pairs of same-pattern histories of "
            f"{self.times} reports over {self.points} grid values, {self.sequences:,} report "
            f"sequences each over {self.outputs} codes: largest loss "
            f"{self.worst_loss_in_draws:.6f} draws' epsilon, never above the draws booked "
            f"within the horizon (excess {self.worst_excess:.3g}), {self.holes} holes; "
            f"{self.pattern_revealed:,} of {self.pattern_pairs:,} pairs with another pattern "
            "are told apart with certainty (timing is not protected)"
        )


def _pattern(history: Sequence[int]) -> tuple[int, ...]:
    first: dict[int, int] = {}
    return tuple(first.setdefault(v, len(first)) for v in history)


def _pmfs(params: Zeal) -> list[dict[int, Fraction]]:
    """The exact code distribution of each grid value's draw (Zeal.output_distribution)."""
    out = []
    for value in grid_values(params).tolist():
        exact = params.output_distribution(value)
        out.append(
            {
                code: Fraction(n, exact.denominator)
                for first, stop, n in exact.runs
                for code in range(first, stop)
                if n
            }
        )
    return out


def _likelihood(
    history: Sequence[int], reports: Sequence[int], pmfs: list[dict[int, Fraction]]
) -> Fraction:
    seen: dict[int, int] = {}
    p = Fraction(1)
    for value, code in zip(history, reports, strict=True):
        if value in seen:
            if seen[value] != code:
                return Fraction(0)
            continue
        seen[value] = code
        p *= pmfs[value].get(code, Fraction(0))
        if not p:
            return p
    return p


def audit_memo(params: Zeal, *, times: int = 3) -> MemoAudit:
    """Check the memo accounting exactly: for every pair of value histories of `times`
    reports over the stream's grid with the same pattern, and every report sequence, the
    likelihood ratio stays within ``(w_hi / w_lo) ** m``, m the grid values first met within
    the smallest window of reports holding every difference (exact rationals). Meant for
    small grids and code widths (the sequences number outputs ** times)."""
    points = _points(params)
    grid = params.grid_sampler
    if grid is None:
        raise ParameterError("the exact memo audit needs the grid sampler")
    if points**times > 4096 or not 1 <= times <= 6:
        raise ParameterError("the exact memo audit is for small grids: points ** times <= 4096")
    pmfs = _pmfs(params)
    outputs = sorted(set().union(*pmfs))
    if len(outputs) ** times > 100_000:
        raise ParameterError("too many report sequences: use a narrower payload_bits")
    ratio = Fraction(grid.w_hi, grid.w_lo)
    per_code = math.log(ratio)
    histories = list(itertools.product(range(points), repeat=times))
    sequences = list(itertools.product(outputs, repeat=times))
    table = {h: [_likelihood(h, y, pmfs) for y in sequences] for h in histories}
    worst_excess, worst_loss, holes, pairs = -math.inf, 0.0, 0, 0
    pattern_pairs = revealed = 0
    for a, b in itertools.combinations(histories, 2):
        if _pattern(a) != _pattern(b):
            if len(set(a)) == len(set(b)):
                pattern_pairs += 1
                revealed += any(
                    (pa == 0) != (pb == 0) for pa, pb in zip(table[a], table[b], strict=True)
                )
            continue
        pairs += 1
        differ = [t for t in range(times) if a[t] != b[t]]
        first, last = differ[0], differ[-1]
        draws = sum(1 for t in range(first, last + 1) if a[t] not in a[:t])
        bound = ratio**draws
        for pa, pb in zip(table[a], table[b], strict=True):
            if (pa == 0) != (pb == 0):
                holes += 1
                continue
            if pa == 0:
                continue
            r = max(pa / pb, pb / pa)
            worst_excess = max(worst_excess, math.log(r / bound))
            worst_loss = max(worst_loss, math.log(r) / per_code)
    return MemoAudit(
        points=points,
        times=times,
        outputs=len(outputs),
        pairs=pairs,
        sequences=len(sequences),
        worst_excess=worst_excess,
        worst_loss_in_draws=worst_loss,
        holes=holes,
        pattern_pairs=pattern_pairs,
        pattern_revealed=revealed,
    )


def simulate_fleet(
    params: Zeal, readings: npt.ArrayLike, *, rng: Randomness = None
) -> tuple[npt.NDArray[np.uint64], _I64]:
    """Simulation of a fleet, one device a row of `readings` (NaN: no reading): each
    device's codes (0 where it has no reading) with a memo of its own, as :class:`Memo`
    makes them, and how many draws each made."""
    x = np.asarray(readings, dtype=np.float64)
    if x.ndim != 2:
        raise ParameterError("readings must be a devices x times matrix")
    devices, points = x.shape[0], _points(params)
    offsets = np.array([draw_offset(rng) for _ in range(devices)])
    present = ~np.isnan(x)
    index = np.zeros(x.shape, dtype=np.int64)
    for d in range(devices):
        index[d, present[d]] = grid_indices(params, x[d, present[d]], float(offsets[d]))
    keys = np.unique((np.arange(devices)[:, None] * points + index)[present])
    table = np.zeros(devices * points, dtype=np.uint64)
    table[keys] = params.perturb(grid_values(params)[keys % points], rng=rng)
    codes = np.where(present, table[np.arange(devices)[:, None] * points + index], 0)
    draws = np.bincount(keys // points, minlength=devices).astype(np.int64)
    return codes.astype(np.uint64), draws
