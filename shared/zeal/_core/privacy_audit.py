"""Audit of the privacy loss a sampler actually realizes.

The loss is ``max over outputs y and inputs x1, x2 of ln(P(y | x1) / P(y | x2))``, computed
from the arithmetic the sampler runs, not from the ideal mechanism:

* ``grid``: exact. Every input reaches the sampler only through its fixed-point band start,
  so the inputs in range are exactly the band starts between those of ``upper`` and
  ``lower``. For each output the probability (an integer over a common denominator) is
  unimodal in the band start, so its maximum is at the start nearest the output's peak and
  its minimum at an end of the range. All outputs are checked when there are at most
  ``max_outputs``; otherwise the outputs near both ends of the range and an even spread
  between them, and the report is exact when the largest ratio found equals
  ``w_hi / w_lo``, which bounds every output's ratio.
* ``paper``: by counting. The paper's sampler maps ``j`` uniform on ``[0, 2**53)`` to a float
  through three monotone pieces; binary search finds how many ``j`` reach each output from
  each input. A sample of outputs and a handful of inputs are checked, so the loss reported
  is a lower bound on the true one.

A *hole* is an output reachable from one input and not from another: infinite loss.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from zeal._core.paper import UNIFORM_BITS
from zeal.errors import ParameterError, ZealWarning

if TYPE_CHECKING:
    from zeal._core.grid import GridSampler
    from zeal._core.paper import PaperSampler

__all__ = ["AuditReport", "Audited", "audit", "output_extremes"]

_F64 = npt.NDArray[np.float64]
_U64 = npt.NDArray[np.uint64]


class Audited(Protocol):
    """What the audit reads of a stream's parameters; :class:`zeal.Zeal` provides it (the
    audit does not import the mechanism, which calls the audit)."""

    @property
    def lower(self) -> float: ...
    @property
    def upper(self) -> float: ...
    @property
    def epsilon(self) -> float: ...
    @property
    def ebar(self) -> float: ...
    @property
    def exponent(self) -> int: ...
    @property
    def payload_bits(self) -> int: ...
    @property
    def grid_sampler(self) -> GridSampler | None: ...
    @property
    def paper_sampler(self) -> PaperSampler | None: ...
    def to_float64(self, codes: npt.ArrayLike) -> _F64: ...
    def from_float64(self, values: npt.ArrayLike) -> _U64: ...


@dataclass(frozen=True)
class AuditReport:
    """What :func:`audit` found. ``loss`` is infinite when there are holes."""

    sampler: str
    epsilon: float
    payload_bits: int
    exponent: int
    loss: float
    finite_loss: float  # the largest loss among outputs without holes
    loss_bound: float | None  # a proven bound over all outputs (grid only)
    holes: int
    outputs_checked: int
    outputs_total: int
    inputs_checked: str
    exact: bool
    worst_code: int | None

    def within_budget(self, tolerance: float = 1e-6) -> bool:
        """Whether the realized loss is at most epsilon * (1 + tolerance), with no holes."""
        return self.holes == 0 and self.loss <= self.epsilon * (1 + tolerance)

    def __str__(self) -> str:
        bound = (
            "" if self.loss_bound is None else f" (bound over all outputs: {self.loss_bound:.9f})"
        )
        return "\n".join(
            (
                f"sampler           {self.sampler}",
                f"epsilon           {self.epsilon!r}",
                f"exponent / bits   {self.exponent} / {self.payload_bits}",
                f"realized loss     {self.loss:.9f}{bound}",
                f"loss w/o holes    {self.finite_loss:.9f}",
                f"holes             {self.holes}",
                f"outputs checked   {self.outputs_checked} of {self.outputs_total}",
                f"inputs checked    {self.inputs_checked}",
                f"exact             {self.exact}",
                f"worst output code {self.worst_code}",
                f"within budget     {self.within_budget()}",
            )
        )


def audit(params: Audited, *, max_outputs: int = 4096, seed: int = 0) -> AuditReport:
    """Measure the privacy loss that `params`' sampler realizes (see module docstring)."""
    if isinstance(max_outputs, bool) or not isinstance(max_outputs, int) or max_outputs < 16:
        raise ParameterError(f"max_outputs must be an integer >= 16, got {max_outputs!r}")
    grid, paper = params.grid_sampler, params.paper_sampler
    if grid is not None:
        return _audit_grid(params, grid, max_outputs)
    assert paper is not None
    return _audit_paper(params, paper, max_outputs, seed)


def _spread(first: int, last: int, count: int) -> list[int]:
    if last - first + 1 <= count:
        return list(range(first, last + 1))
    return sorted({round(first + i * (last - first) / (count - 1)) for i in range(count)})


def output_extremes(grid: GridSampler, q: int, s_lo: int, s_hi: int) -> tuple[int, int]:
    """Largest and smallest probability numerator of depth q over band starts [s_lo, s_hi].

    The band's share of q's rounding weight is a window sum of a tent, unimodal in the start:
    largest where the window is centred on the tent's peak (clipped), smallest at an end.
    """
    a = 1 << (grid.cell_bits + 1)
    base = grid.w_lo * grid.tent_sum(q, 0, grid.cells)
    peak = Fraction(q * a - 1 + 2 * grid.top, 2) - Fraction(grid.band - 1, 2)
    candidates = {s_lo, s_hi} | {min(max(math.floor(peak) + d, s_lo), s_hi) for d in (0, 1)}
    values = [
        base + (grid.w_hi - grid.w_lo) * grid.tent_sum(q, s, s + grid.band) for s in candidates
    ]
    return max(values), min(values)


def _audit_grid(params: Audited, grid: GridSampler, max_outputs: int) -> AuditReport:
    g = grid.frac_bits
    fixed = grid.fixed_starts(np.array([params.upper, params.lower]))
    s_lo = int(fixed[0]) >> g
    s_hi = min(-(-int(fixed[1]) >> g), grid.max_start)
    q_min, q_max = grid.depth_range
    total = q_max - q_min + 1
    if total <= max_outputs:
        depths = list(range(q_min, q_max + 1))
    else:
        edge = min(max_outputs // 4, (grid.band >> grid.cell_bits) + 4)
        depths = sorted(
            set(range(q_min, q_min + edge))
            | set(range(q_max - edge + 1, q_max + 1))
            | set(_spread(q_min + edge, q_max - edge, max_outputs - 2 * edge))
        )
    worst, worst_q, holes = Fraction(1), None, 0
    for q in depths:
        high, low = output_extremes(grid, q, s_lo, s_hi)
        if low == 0:
            holes += high > 0
            continue
        if Fraction(high, low) > worst:
            worst, worst_q = Fraction(high, low), q
    finite = math.log(worst)
    top_code = (1 << grid.payload_bits) - 2
    return AuditReport(
        sampler="grid",
        epsilon=params.epsilon,
        payload_bits=params.payload_bits,
        exponent=params.exponent,
        loss=math.inf if holes else finite,
        finite_loss=finite,
        loss_bound=math.log(grid.ratio),
        holes=holes,
        outputs_checked=len(depths),
        outputs_total=total,
        inputs_checked=f"all (band starts {s_lo}..{s_hi})",
        exact=len(depths) == total or worst == grid.ratio,
        worst_code=None if worst_q is None else top_code - worst_q,
    )


def _first_at_least(
    paper: PaperSampler,
    x: float,
    piece: int,
    span: tuple[int, int],
    targets: npt.NDArray[np.float64],
    *,
    strict: bool,
) -> npt.NDArray[np.int64]:
    """Per target, the first j in [lo, hi) = span whose output is >= target (> if strict),
    else hi."""
    lo, hi = span
    low = np.full(targets.size, lo, dtype=np.int64)
    high = np.full(targets.size, hi, dtype=np.int64)
    while True:
        active = low < high
        if not active.any():
            return low
        mid = (low + high) // 2
        out = paper.evaluate(x, piece, np.where(active, mid, lo))
        ok = (out > targets) if strict else (out >= targets)
        high = np.where(active & ok, mid, high)
        low = np.where(active & ~ok, mid + 1, low)


def _audit_paper(params: Audited, paper: PaperSampler, max_outputs: int, seed: int) -> AuditReport:
    lo_x, hi_x = params.lower, params.upper
    inputs = [lo_x, lo_x + (hi_x - lo_x) / 4, params.ebar, hi_x - (hi_x - lo_x) / 4, hi_x]
    top = 1 << UNIFORM_BITS
    ends = np.array([0, top - 1], dtype=np.int64)
    extremes = [
        float(paper.evaluate(x, piece, ends)[i]) for x in inputs for piece, i in ((0, 0), (2, 1))
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZealWarning)
        first_code = int(params.from_float64(np.array([min(extremes)]))[0])
        last_code = int(params.from_float64(np.array([max(extremes)]))[0])
    total = last_code - first_code + 1
    if total <= max_outputs:
        codes = np.arange(first_code, last_code + 1, dtype=np.int64)
    else:
        rng = np.random.default_rng(seed)
        codes = np.unique(rng.integers(first_code, last_code + 1, size=max_outputs))
    targets = params.to_float64(codes)
    counts = np.zeros((len(inputs), codes.size), dtype=np.int64)
    for i, x in enumerate(inputs):
        band_start, right_start = paper.piece_starts(x)
        for piece, (a, b) in enumerate(
            ((0, band_start), (band_start, right_start), (right_start, top))
        ):
            if a < b:
                counts[i] += _first_at_least(
                    paper, x, piece, (a, b), targets, strict=True
                ) - _first_at_least(paper, x, piece, (a, b), targets, strict=False)
    high, low = counts.max(axis=0), counts.min(axis=0)
    hole = (low == 0) & (high > 0)
    usable = low > 0
    ratios = np.where(usable, high / np.maximum(low, 1), 1.0)
    finite = float(np.log(ratios.max())) if usable.any() else 0.0
    worst = int(codes[int(np.argmax(np.where(hole, np.inf, ratios)))])
    return AuditReport(
        sampler="paper",
        epsilon=params.epsilon,
        payload_bits=params.payload_bits,
        exponent=params.exponent,
        loss=math.inf if hole.any() else finite,
        finite_loss=finite,
        loss_bound=None,
        holes=int(hole.sum()),
        outputs_checked=int(codes.size),
        outputs_total=total,
        inputs_checked=", ".join(f"{x!r}" for x in inputs),
        exact=False,
        worst_code=worst,
    )
