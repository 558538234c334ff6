"""The normal MLE of a sample doubly censored at its own quantiles (paper 003, Eq. (14)):
the partition statistics below the lower quantile l and above the upper one u are known
only to lie beyond them. :mod:`zeal.compare` uses it as a robust estimate of a group's
location.

The fit runs on the sample standardized by its median and spread, with the log-likelihood's
gradient and Hessian in closed form, so its result does not depend on the data's scale: a
sample and the same sample times 10**6 give the same standard error times 10**6.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from zeal.errors import FitError, ParameterError

__all__ = ["censored_normal_mle", "censoring_count"]

_F64 = npt.NDArray[np.float64]
_SQRT2 = math.sqrt(2.0)
_SQRT_2PI = math.sqrt(2.0 * math.pi)


def censoring_count(size: int, proportion: float) -> int:
    """k = round(P * alpha), half up (paper 003's ⌊Pα⌉ in Eqs. (22)-(27)): how many of `size`
    partition statistics are cut, pulled in or censored at one end. `proportion` is taken as
    the decimal it was written as (0.15 of 10 is 2, not 1 through 0.15's binary value)."""
    if not 0.0 <= proportion < 0.5:
        raise ParameterError(f"the cut proportion must be in [0, 0.5), got {proportion!r}")
    # repr is the shortest decimal that reads back as the float: 0.15, not 0.1499999...
    return math.floor(size * Fraction(repr(float(proportion))) + Fraction(1, 2))


def censored_normal_mle(
    z: _F64, lower: float = 0.1, upper: float | None = None
) -> tuple[float, float, float]:
    """(mu, squared standard error of mu, degrees of freedom) of a normal sample doubly
    censored at its sample quantiles (paper 003 Eq. (14)): the k_l = round(P * `lower`)
    smallest values count only as lying at or below l, the k_u = round(P * `upper`) largest
    (`upper` defaults to `lower`) as lying at or above u, where l and u are the largest
    censored and the smallest censored value, and the rest enter with their normal density.
    The log-likelihood sum log phi((x - mu)/sigma) - log sigma over the kept values, plus
    k_l log Phi((l - mu)/sigma) + k_u log Phi((mu - u)/sigma), is maximized by Newton's
    method on (mu, log sigma); the squared standard error is the inverse observed
    information's mu entry, and the t reference has the kept values less one degrees of
    freedom. A fit whose information is not finite and positive definite is refused
    (FitError), never reported with a zero or a negative variance."""
    upper = lower if upper is None else upper
    x = np.sort(np.asarray(z, dtype=np.float64).ravel())
    size = x.size
    if size < 5:
        raise ParameterError(f"the censored MLE needs at least 5 partitions, has {size}")
    if not np.all(np.isfinite(x)):
        raise ParameterError("the partition statistics must be finite")
    k_low, k_high = censoring_count(size, lower), censoring_count(size, upper)
    kept = x[k_low : size - k_high]
    if kept.size < 2:
        raise ParameterError(
            f"censoring {k_low} + {k_high} of {size} partitions leaves {kept.size}"
        )
    # standardize: the fit is scale-free, and mapped back at the end
    centre = float(np.median(x))
    spread = float(np.std(x, ddof=1))
    if not (math.isfinite(spread) and spread > 0):
        raise FitError("the partition statistics have no spread: nothing to fit")
    inside = (kept - centre) / spread
    low = (float(x[k_low - 1]) - centre) / spread if k_low else None
    high = (float(x[size - k_high]) - centre) / spread if k_high else None
    ends: _Ends = ((k_low, low, -1.0), (k_high, high, 1.0))
    theta = np.array([float(inside.mean()), math.log(max(float(np.std(inside)), 1e-3))])
    value = _loglik(theta, inside, ends)
    for _ in range(200):
        gradient, hessian = _derivatives(theta, inside, ends)
        step = _ascent(gradient, hessian)
        scale = 1.0
        while scale > 1e-9:
            trial = theta + scale * step
            found = _loglik(trial, inside, ends)
            if math.isfinite(found) and found >= value - 1e-12 * abs(value):
                break
            scale /= 2
        else:
            break
        theta, value = trial, found
        if float(np.max(np.abs(scale * step))) < 1e-12:
            break
    gradient, hessian = _derivatives(theta, inside, ends)
    information = -hessian
    if not np.all(np.isfinite(information)) or float(np.max(np.abs(gradient))) > 1e-6 * size:
        raise FitError("the censored normal fit did not converge")
    eigen = np.linalg.eigvalsh(information)
    if not eigen[0] > 0:
        raise FitError(
            "the censored normal fit's observed information is not positive definite: no "
            "standard error"
        )
    variance = float(np.linalg.inv(information)[0, 0]) * spread * spread
    if not (math.isfinite(variance) and variance > 0):
        raise FitError("the censored normal fit gives no finite, positive variance")
    return centre + float(theta[0]) * spread, variance, kept.size - 1.0


def _ascent(gradient: _F64, hessian: _F64) -> _F64:
    """Newton's step where the Hessian is negative definite, else the gradient."""
    try:
        if np.linalg.eigvalsh(hessian)[-1] < 0:
            return np.asarray(np.linalg.solve(hessian, -gradient), dtype=np.float64)
    except np.linalg.LinAlgError:
        pass
    return gradient


def _mills(t: float) -> float:
    """phi(t) / Phi(t), accurate in the far left tail."""
    if t > -30:
        return math.exp(-0.5 * t * t) / _SQRT_2PI / (0.5 * math.erfc(-t / _SQRT2))
    # Phi(t) ~ phi(t) / -t * (1 - 1/t**2 + 3/t**4): the ratio's asymptotic series
    return -t / (1 - 1 / (t * t) + 3 / t**4)


def _log_cdf(t: float) -> float:
    """log Phi(t), accurate in the far left tail."""
    if t > -30:
        return math.log(0.5 * math.erfc(-t / _SQRT2))
    return -0.5 * t * t - math.log(-t * _SQRT_2PI)


#: The censored ends: (values censored, the bound, -1 below or +1 above) for each end.
_Ends = tuple[tuple[int, float | None, float], ...]


def _loglik(theta: _F64, inside: _F64, ends: _Ends) -> float:
    mu, tau = float(theta[0]), float(theta[1])
    sigma = math.exp(tau)
    r = (inside - mu) / sigma
    total = float(-0.5 * (r @ r)) - inside.size * tau
    for k, bound, sign in ends:
        if bound is not None and k:
            total += k * _log_cdf(sign * (mu - bound) / sigma)
    return total


def _derivatives(theta: _F64, inside: _F64, ends: _Ends) -> tuple[_F64, _F64]:
    """The gradient and Hessian of :func:`_loglik` in (mu, tau = log sigma), in closed form.

    Kept values, r = (x - mu)/sigma: d/dmu = sum r / sigma, d/dtau = sum r**2 - m,
    d2/dmu2 = -m / sigma**2, d2/dmu dtau = -2 sum r / sigma, d2/dtau2 = -2 sum r**2.
    A censored end contributes k log Phi(t), t = (l - mu)/sigma below (dt/dmu = -1/sigma)
    or t = (mu - u)/sigma above (dt/dmu = 1/sigma); in both dt/dtau = -t, and with
    g1 = lambda(t), g2 = -lambda(t) (t + lambda(t)) (lambda = phi/Phi, the derivatives of
    log Phi) the chain rule gives d/dmu = k g1 dt/dmu, d/dtau = -k g1 t,
    d2/dmu2 = k g2 / sigma**2, d2/dmu dtau = -k (g2 t + g1) dt/dmu, d2/dtau2 = k (g2 t**2 +
    g1 t)."""
    mu, tau = float(theta[0]), float(theta[1])
    sigma = math.exp(tau)
    r = (inside - mu) / sigma
    m = inside.size
    s1, s2 = float(r.sum()), float(r @ r)
    gradient = np.array([s1 / sigma, s2 - m])
    hessian = np.array([[-m / sigma**2, -2 * s1 / sigma], [-2 * s1 / sigma, -2 * s2]])
    for k, bound, sign in ends:
        if bound is None or not k:
            continue
        t = sign * (mu - bound) / sigma
        dmu = sign / sigma
        g1 = _mills(t)
        g2 = -g1 * (t + g1)
        gradient += k * np.array([g1 * dmu, -g1 * t])
        cross = -k * (g2 * t + g1) * dmu
        hessian += np.array([[k * g2 / sigma**2, cross], [cross, k * (g2 * t * t + g1 * t)]])
    return gradient, hessian
