"""Stream parameters of the Zeal mechanism and everything done with them.

:class:`Zeal` derives the paper's values (``C``, ``p``, ``E_enc``, ``E_vul``, ``Abar``,
``gamma_min``) from the feasible range and epsilon, picks the code width, and offers
perturbation (on the device), float reconstruction, decoding and the average with bounds
(on the server). Every output is a float64 in the binade ``[2**Eu, 2**(Eu+1))`` sharing its
top ``shared_bits`` bits, so only the low ``payload_bits`` bits (the *code*) are sent.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from zeal._core.derivation import MAX_EPSILON, SAMPLERS, Derived, derive
from zeal._core.distribution import OutputDistribution
from zeal._core.exact import exact_sum, exact_sum_squares
from zeal._core.grid import GridSampler
from zeal._core.paper import PaperSampler
from zeal._core.randomness import Randomness
from zeal.errors import CodeError, ParameterError, ReadingError, ZealWarning
from zeal.estimate import (
    Estimate,
    bernstein_half_width,
    bernstein_tail,
    check_confidence,
    check_real,
    cut,
    normal_quantile,
)
from zeal.policy import check_policy, readings_per_day, readings_per_hour
from zeal.protocol import check_grid_points

if TYPE_CHECKING:
    from zeal._core.privacy_audit import AuditReport

__all__ = ["MAX_EPSILON", "SAMPLERS", "Zeal"]

_SAMPLER_VERSIONS: Final = {"grid": 1, "paper": 1}
#: The attributes ``derive`` gives an instance (``_grid`` is ``Derived.grid``, and so on).
_DERIVED: Final = tuple(
    f"_{name}" if name in ("grid", "paper", "prefix", "top") else name
    for name in Derived.__dataclass_fields__
)

_U64 = npt.NDArray[np.uint64]
_F64 = npt.NDArray[np.float64]


class Zeal:
    """Parameters of one Zeal stream: feasible range, budget, code width, sampler.

    ``Zeal(lower=..., upper=..., epsilon=...)`` picks the narrowest code whose grid variance
    stays within 1 % of the mechanism's smallest variance; ``payload_bits`` or ``exponent``
    choose the width instead. Instances are immutable, hashable and picklable.

    Derived values (paper 001): ``C`` (Eq. (10)), ``p`` (Eq. (9)), ``e_enc`` (Theorem 5,
    Eq. (21)), ``e_vul`` (Theorem 7, Eq. (31)), ``exponent`` (E_U*), ``abar`` (Eq. (22),
    rounded to float64 for display; the sampler and decoder use it exactly), ``shared_bits``
    (gamma_min, Theorem 6, Eq. (28)), ``payload_bits`` (64 - gamma_min), ``grid_step``
    (ulp(2**exponent)), ``realized_epsilon`` (the loss the grid sampler actually realizes:
    ``ln(w_hi/w_lo) <= epsilon``; ``None`` for the paper sampler, whose loss only
    :meth:`audit` can tell) and ``fingerprint`` (8 bytes identifying all of the above).

    ``max_epsilon_per_day`` is the stream's privacy policy (zeal.policy), enforced by agent
    and collector alike; the mechanism ignores it, but it is in the fingerprint, so a device
    without a changed policy is refused. ``readings_per_day`` is what it allows; None (no
    policy) keeps the fingerprints of parameters made before policies existed;
    ``readings_per_hour`` the hour's cap derived from it.

    ``grid_points`` makes the stream longitudinal (zeal.longitudinal): each device rounds a
    reading to one of that many evenly spaced values of the range with a secret offset of its
    own and sends the code it memoized for that value. None (the default) is a plain stream,
    whose fingerprint is the one it always had.
    """

    __slots__ = (
        "C",
        "_grid",
        "_paper",
        "_prefix",
        "_top",
        "abar",
        "code_max",
        "code_min",
        "e_enc",
        "e_vul",
        "ebar",
        "epsilon",
        "exponent",
        "fingerprint",
        "grid_points",
        "grid_step",
        "half_width",
        "lower",
        "max_epsilon_per_day",
        "p",
        "payload_bits",
        "readings_per_day",
        "readings_per_hour",
        "realized_epsilon",
        "sampler",
        "shared_bits",
        "upper",
    )

    C: float
    p: float
    e_enc: int
    e_vul: int
    ebar: float
    half_width: float
    lower: float
    upper: float
    epsilon: float
    exponent: int
    payload_bits: int
    shared_bits: int
    grid_step: float
    abar: float
    fingerprint: bytes
    max_epsilon_per_day: float | None
    grid_points: int | None
    readings_per_day: int | None
    readings_per_hour: int | None
    realized_epsilon: float | None
    sampler: str
    code_min: int
    code_max: int
    _grid: GridSampler | None
    _paper: PaperSampler | None
    _prefix: int
    _top: Fraction

    def __init__(
        self,
        *,
        lower: float,
        upper: float,
        epsilon: float,
        payload_bits: int | None = None,
        exponent: int | None = None,
        sampler: str = "grid",
        max_epsilon_per_day: float | None = None,
        grid_points: int | None = None,
    ) -> None:
        try:
            derived = derive(
                lower, upper, epsilon, payload_bits=payload_bits, exponent=exponent, sampler=sampler
            )
            cap = check_policy(derived.epsilon, max_epsilon_per_day)
            points = check_grid_points(grid_points, derived.payload_bits)
            if points is not None and derived.sampler != "grid":
                raise ParameterError("a longitudinal stream needs the grid sampler")
        except (OverflowError, ZeroDivisionError) as exc:
            raise ParameterError(
                f"lower={lower!r}, upper={upper!r}, epsilon={epsilon!r} are too extreme for "
                f"float64 arithmetic ({exc})"
            ) from exc
        # The instance carries the derived values as its own attributes (slots), which the
        # hot paths read; the private ones with a leading underscore.
        for name in _DERIVED:
            object.__setattr__(self, name, getattr(derived, name.lstrip("_")))
        daily = None if cap is None else readings_per_day(derived.epsilon, cap)
        hourly = None if daily is None else readings_per_hour(daily)
        object.__setattr__(self, "max_epsilon_per_day", cap)
        object.__setattr__(self, "grid_points", points)
        object.__setattr__(self, "readings_per_day", daily)
        object.__setattr__(self, "readings_per_hour", hourly)
        object.__setattr__(self, "fingerprint", self._fingerprint())

    # -- construction helpers --------------------------------------------------------------

    def _fingerprint(self) -> bytes:
        text = "|".join(
            (
                "zeal/1",
                f"{self.sampler}/{_SAMPLER_VERSIONS[self.sampler]}",
                self.lower.hex(),
                self.upper.hex(),
                self.epsilon.hex(),
                str(self.exponent),
                str(self.payload_bits),
            )
        )
        if self.max_epsilon_per_day is not None:
            text += f"|day/{self.max_epsilon_per_day.hex()}"
        if self.grid_points is not None:
            text += f"|memo/{self.grid_points}"
        return hashlib.sha256(text.encode()).digest()[:8]

    # -- value semantics -------------------------------------------------------------------

    def _key(self) -> tuple[float, float, float, int, str, float | None, int | None]:
        cap, points = self.max_epsilon_per_day, self.grid_points
        return (self.lower, self.upper, self.epsilon, self.exponent, self.sampler, cap, points)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Zeal parameters are immutable (tried to set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Zeal parameters are immutable (tried to delete {name!r})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Zeal) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, self._key())

    def __repr__(self) -> str:
        cap = self.max_epsilon_per_day
        policy = "" if cap is None else f", max_epsilon_per_day={cap!r}"
        if self.grid_points is not None:
            policy += f", grid_points={self.grid_points}"
        return (
            f"Zeal(lower={self.lower!r}, upper={self.upper!r}, epsilon={self.epsilon!r}, "
            f"exponent={self.exponent}, sampler={self.sampler!r}; "
            f"payload_bits={self.payload_bits}{policy})"
        )

    # -- derived quantities ----------------------------------------------------------------

    @property
    def transmission_ratio(self) -> float:
        """TR = 1 - gamma_min / 64 (Eq. (27)): the share of a float64 that is sent."""
        return 1 - self.shared_bits / 64

    def mechanism_variance(self, reading: float) -> float:
        """Var[x*] of the continuous mechanism at a reading (Theorem 2, Eq. (14))."""
        s = math.exp(self.epsilon / 2)
        z = (reading - self.ebar) / self.half_width
        return self.half_width * self.half_width * (z * z / (s - 1) + (s + 3) / (3 * (s - 1) ** 2))

    def variance(self, reading: float) -> float:
        """Var[decode] at a reading: Theorem 2 plus the grid's rounding term D**2/6.

        Unbiased rounding of a point at fractional grid position f adds f(1-f) D**2; over the
        many grid steps a reading's outputs spread across, f is close to uniform, giving
        D**2/6 (never more than D**2/4).
        """
        return self.mechanism_variance(reading) + self.grid_step * self.grid_step / 6

    # -- device side -----------------------------------------------------------------------

    def perturb(self, readings: npt.ArrayLike, *, rng: Randomness = None) -> _U64:
        """Privatize readings into codes (numpy uint64, same shape as `readings`).

        Readings outside ``[lower, upper]`` are clipped to it first (as the mechanism is only
        defined there; clipping is part of the device's computation and never reported).
        NaN or infinite readings raise :class:`ReadingError` and nothing is perturbed.
        Randomness: the OS CSPRNG unless a numpy Generator is passed (tests only).
        """
        array = np.asarray(readings)
        if array.dtype.kind not in "iuf":
            raise ReadingError(f"readings must be real numbers, got an array of {array.dtype}")
        flat = array.astype(np.float64, copy=False).ravel()
        bad = np.flatnonzero(~np.isfinite(flat))
        if bad.size:
            raise ReadingError(
                f"reading at index {int(bad[0])} is {float(flat[bad[0]])!r}: "
                "readings must be finite "
                f"numbers in [{self.lower!r}, {self.upper!r}] (out-of-range ones are clipped)"
            )
        clipped = np.clip(flat, self.lower, self.upper)
        if self._grid is not None:
            codes = self._grid.sample(clipped, rng)
        else:
            assert self._paper is not None
            codes = self._codes_of_floats(self._paper.sample_values(clipped, rng))
        return codes.reshape(array.shape)

    # -- exactness and audit ---------------------------------------------------------------

    @property
    def grid_sampler(self) -> GridSampler | None:
        """The integer grid sampler that privatizes readings (None for the paper's)."""
        return self._grid

    @property
    def paper_sampler(self) -> PaperSampler | None:
        """The paper's float sampler (None for the grid sampler)."""
        return self._paper

    def output_distribution(self, reading: float) -> OutputDistribution:
        """The exact distribution of codes the grid sampler produces for a reading."""
        if self._grid is None:
            raise ParameterError("exact output distributions exist for the grid sampler only")
        x = min(max(check_real("reading", reading), self.lower), self.upper)
        fixed = int(self._grid.fixed_starts(np.array([x]))[0])
        return OutputDistribution.of(self._grid, fixed, self._top, self.grid_step)

    def audit(self, **options: Any) -> AuditReport:
        """The privacy loss this sampler realizes (see :func:`zeal.audit`)."""
        from zeal._core.privacy_audit import audit

        return audit(self, **options)

    # -- server side: codes back to values, decoding, AVG* and its bounds ----------------

    def _valid_codes(self, codes: npt.ArrayLike) -> _U64:
        array = np.asarray(codes)
        if array.size == 0:
            return np.zeros(array.shape, dtype=np.uint64)
        if array.dtype.kind not in "iu":
            raise CodeError(f"codes must be integers, got an array of {array.dtype}")
        if array.dtype.kind == "i" and array.size and int(array.min()) < 0:
            raise CodeError(f"codes must be >= {self.code_min}, got {int(array.min())}")
        result = array.astype(np.uint64, copy=False)
        if result.size:
            low, high = int(result.min()), int(result.max())
            if low < self.code_min or high > self.code_max:
                bad = low if low < self.code_min else high
                raise CodeError(
                    f"code {bad} is outside [{self.code_min}, {self.code_max}], the codes this "
                    f"stream's {self.payload_bits}-bit mechanism can produce"
                )
        return result

    def _codes_of_floats(self, values: _F64) -> _U64:
        bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
        mask = np.uint64((1 << self.payload_bits) - 1)
        off_grid = np.flatnonzero((bits & ~mask) != np.uint64(self._prefix))
        if off_grid.size:
            i = int(off_grid[0])
            raise CodeError(
                f"value {float(values.ravel()[i])!r} at index {i} is not an output of this "
                f"stream: outputs are float64 in [{self._value_of(self.code_min)!r}, "
                f"{self._value_of(self.code_max)!r}] sharing their top {self.shared_bits} bits"
            )
        return bits & mask

    def _value_of(self, code: int) -> float:
        return float(np.array([self._prefix | code], dtype=np.uint64).view(np.float64)[0])

    def to_float64(self, codes: npt.ArrayLike) -> _F64:
        """The privatized values x* = x + Abar, rebuilt bit-exactly from codes."""
        valid = self._valid_codes(codes)
        values: _F64 = (valid | np.uint64(self._prefix)).view(np.float64)
        return values

    def from_float64(self, values: npt.ArrayLike) -> _U64:
        """Codes of privatized float64 values; values off the grid or out of range raise."""
        array = np.asarray(values)
        if array.dtype.kind != "f":
            raise CodeError(f"privatized values must be float64, got an array of {array.dtype}")
        return self._valid_codes(self._codes_of_floats(array.astype(np.float64, copy=False)))

    def decode(self, codes: npt.ArrayLike) -> _F64:
        """Per-reading estimates x* - Abar = Ebar + C - q D, computed without cancellation.

        Unbiased for the grid sampler. For the paper sampler Abar is its float64 Abar, which
        is what that sampler added and what the paper's aggregator subtracts.

        q D is exact (an integer times a power of two); no float near 2**exponent is formed.
        """
        valid = self._valid_codes(codes)
        depth = ((1 << self.payload_bits) - 2) - valid.astype(np.int64)
        estimates: _F64 = self.ebar + (self.C - depth.astype(np.float64) * self.grid_step)
        return estimates

    def _sum_numerator(self) -> tuple[int, int, int, int]:
        """(top, D, denominator, highest code) with decoded sums = (n * top - D * (n *
        highest - sum of codes)) / denominator exactly: the common denominator of the top
        value and the grid step, over which the arithmetic is in integers."""
        step = Fraction(self.grid_step)
        denominator = math.lcm(self._top.denominator, step.denominator)
        top = self._top.numerator * (denominator // self._top.denominator)
        grid = step.numerator * (denominator // step.denominator)
        return top, grid, denominator, (1 << self.payload_bits) - 2

    def decoded_sums(self, counts: list[int], sum_codes: list[int]) -> _F64:
        """Per partition, the sum of its decoded values (n times AVG*, Eq. (15)) from the
        exact sums of its codes, in exact integer arithmetic and rounded once: the partition
        statistics of a comparison (``zeal.compare.Partitions``), at integer cost per
        partition instead of a whole estimate's."""
        if len(counts) != len(sum_codes):
            raise ParameterError(f"{len(counts)} counts but {len(sum_codes)} sums of codes")
        top, grid, denominator, highest = self._sum_numerator()
        sums = [
            (n * top - grid * (n * highest - codes)) / denominator  # int / int: rounded once
            for n, codes in zip(counts, sum_codes, strict=True)
        ]
        return np.asarray(sums, dtype=np.float64)

    def mean_of_sums(self, n: int, sum_codes: int) -> float:
        """AVG* (Eq. (15)) from n and the exact sum of codes, rounded once: the same float
        as :meth:`estimate_from_sums`'s mean, without the squares its standard error needs."""
        if n < 1:
            raise CodeError("cannot estimate a mean from zero codes")
        top, grid, denominator, highest = self._sum_numerator()
        return (n * top - grid * (n * highest - sum_codes)) / (n * denominator)

    def variance_bound(self) -> float:
        """An upper bound on Var[decode] valid for every reading in range.

        Grid: computed exactly from the sampler's tables (see GridSampler.cell_variance_bound).
        Paper: Theorem 2 at |z| = 1 plus D**2/4, nominal since that sampler is biased.
        """
        d2 = self.grid_step * self.grid_step
        if self._grid is not None:
            return float(self._grid.cell_variance_bound()) * d2 * (1 + 1e-12)
        return self.mechanism_variance(self.upper) + d2 / 4

    def error_bound(self) -> float:
        """M: the largest |decode - reading| any reading in range can produce."""
        low = float(self._decoded(self.code_min))
        high = float(self._decoded(self.code_max))
        return max(high - self.lower, self.upper - low)

    def _decoded(self, code: int) -> Fraction:
        depth = (1 << self.payload_bits) - 2 - code
        return self._top - depth * Fraction(self.grid_step)

    def estimate_mean(self, codes: npt.ArrayLike, *, confidence: float = 0.95) -> Estimate:
        """AVG* (Eq. (15)) of codes with its standard error and two intervals (cut to the
        range: zeal.estimate.cut).

        The sums are exact integers over codes; the mean is formed in rational arithmetic
        and rounded once. ``std_error`` uses the sample variance (for a single code, the
        worst-case variance bound).
        """
        valid = self._valid_codes(codes).ravel()
        k = self.payload_bits
        return self.estimate_from_sums(
            int(valid.size),
            exact_sum(valid, k),
            exact_sum_squares(valid, k),
            confidence=confidence,
        )

    def estimate_from_sums(
        self, n: int, sum_codes: int, sum_squares: int, *, confidence: float = 0.95
    ) -> Estimate:
        """The same estimate from exact sums of codes and of squared codes (e.g. a store's).

        Raises CodeError when the sums cannot come from n valid codes.
        """
        level = check_confidence(confidence)
        if n < 1:
            raise CodeError("cannot estimate a mean from zero codes")
        if not (
            n * self.code_min <= sum_codes <= n * self.code_max
            and sum_squares >= 0
            and sum_codes * sum_codes <= n * sum_squares
        ):
            raise CodeError(
                f"sums (n={n}, sum={sum_codes}, squares={sum_squares}) are not "
                "those of valid codes of this stream"
            )
        top = (1 << self.payload_bits) - 2
        sum_q = n * top - sum_codes
        sum_q2 = n * top * top - 2 * top * sum_codes + sum_squares
        step = Fraction(self.grid_step)
        mean = float(self._top - step * Fraction(sum_q, n))
        if n > 1:
            sample_var = float(step * step * Fraction(n * sum_q2 - sum_q * sum_q, n * (n - 1)))
        else:
            sample_var = self.variance_bound()
        std_error = math.sqrt(sample_var / n)
        z = normal_quantile(level)
        half = bernstein_half_width(
            level, n=n, variance=self.variance_bound(), bound=self.error_bound()
        )
        return Estimate(
            mean=mean,
            n=n,
            std_error=std_error,
            ci=cut(mean - z * std_error, mean + z * std_error, self.lower, self.upper),
            guaranteed=cut(mean - half, mean + half, self.lower, self.upper),
            in_range=self.lower <= mean <= self.upper,
            confidence=level,
        )

    def absolute_bound(self, lam: float, *, n: int) -> float:
        """Upper bound on P(|AVG* - AVG| >= lam) for n readings (Theorem 3, two-sided)."""
        return bernstein_tail(lam, n=n, variance=self.variance_bound(), bound=self.error_bound())

    def relative_bound(self, lam: float, *, n: int, average: float) -> float:
        """Upper bound on P(|AVG* - AVG| / |AVG| >= lam) (Theorem 4, derived from Theorem 3)."""
        avg = check_real("average", average)
        if avg == 0:
            raise ParameterError("the relative error is undefined for an average of 0")
        return self.absolute_bound(lam * abs(avg), n=n)


def _rebuild(*key: Any) -> Zeal:
    """A Zeal from the fields of Zeal._key, in order (unpickling)."""
    names = (
        "lower",
        "upper",
        "epsilon",
        "exponent",
        "sampler",
        "max_epsilon_per_day",
        "grid_points",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZealWarning)
        return Zeal(**dict(zip(names, key, strict=False)))
