"""Bayes estimates beside AVG* on /average and /series (``zeal.bayes``, paper 004; see
docs/bayes.md): the query parameters, the prior's syntax, and the reads each model needs.

The window-mean model needs only n and AVG*, which the average has already read. The
binary and constant models need how often each code occurs, so they read the window's
codes from the segments, as /export does (at most MAX_CODES of them). None of them writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

import numpy as np
from fastapi import Query
from sqlalchemy.orm import Session

from zeal import ParameterError, Zeal
from zeal.bayes import (
    NormalPrior,
    Posterior,
    binary_posterior,
    constant_posterior,
    mean_posterior,
)
from zeal_server import store
from zeal_server.api.deps import devices_in, invalid
from zeal_server.api.schemas import BayesOut
from zeal_server.store.models import Stream

__all__ = [
    "ASSUMES",
    "MAX_CODES",
    "BayesModel",
    "Estimator",
    "PriorText",
    "Reader",
    "bayes_reader",
    "device_ids",
    "selected_devices",
    "window_codes",
]

#: Codes a binary or constant query reads at most (beyond, AVG* is as good: use it).
MAX_CODES = 1_000_000

ASSUMES = {
    "mean": "any readings; the window's mean from AVG* and Zeal's exact variance at each "
    "candidate mean (a normal likelihood), the prior truncated to the range",
    "binary": "every reading is the stream's lower or upper end (occupancy, a door); the "
    "share at upper, from the exact likelihood of each code",
    "constant": "every reading is one fixed value (a device measuring a fixed quantity); "
    "that value, from the exact likelihood of each code",
}

Estimator = Annotated[
    Literal["avg", "bayes"],
    Query(
        description="avg: AVG* only (default); bayes: also the posterior summary of `model` "
        "beside it (docs/bayes.md). Bayes estimates are never summed into other figures"
    ),
]
BayesModel = Annotated[
    Literal["mean", "binary", "constant"],
    Query(
        description="with estimator=bayes, what the readings are assumed to be. "
        + "; ".join(f"{k}: {v}" for k, v in ASSUMES.items())
    ),
]
PriorText = Annotated[
    str | None,
    Query(
        max_length=100,
        description="uniform (the default: over the range, or Beta(1, 1) for binary); "
        "normal:m,sd (mean and constant: truncated to the range); beta:a,b (binary)",
    ),
]

#: Per window (or series point): n, AVG* (None without readings) and, for the models that
#: need them, the codes -> the summary shown beside AVG*.
Reader = Callable[[int, float | None, np.ndarray | None], BayesOut | None]


def _numbers(text: str, count: int) -> list[float]:
    parts = text.split(",")
    if len(parts) != count:
        raise ValueError(f"{count} numbers separated by a comma")
    return [float(p) for p in parts]


def _prior(model: str, text: str | None) -> NormalPrior | tuple[float, float] | None:
    """The prior a query names, checked against its model (a 422 when it does not fit)."""
    if text is None or text == "uniform":
        return (1.0, 1.0) if model == "binary" else None
    kind, _, rest = text.partition(":")
    wanted = "beta" if model == "binary" else "normal"
    if kind != wanted:
        raise invalid(
            "query", "prior", f"model {model} takes prior=uniform or {wanted}:..., got {text!r}"
        )
    try:
        return _beta(*_numbers(rest, 2)) if model == "binary" else NormalPrior(*_numbers(rest, 2))
    except (ValueError, ParameterError) as exc:
        raise invalid("query", "prior", f"prior {text!r}: {exc}") from exc


def _beta(a: float, b: float) -> tuple[float, float]:
    if not (a > 0 and b > 0):  # also refuses nan
        raise ValueError("a Beta prior needs a > 0 and b > 0")
    return a, b


def window_codes(
    session: Session, stream: Stream, first: int, stop: int, device_ids: store.Devices
) -> dict[int, np.ndarray]:
    """The codes stored in buckets [first, stop), per bucket, of `device_ids` (or all)."""
    wanted = None
    if device_ids is not None:
        ids = device_ids if isinstance(device_ids, list) else session.scalars(device_ids)
        wanted = np.fromiter((int(i) for i in ids), dtype=np.int64)
    found: dict[int, list[np.ndarray]] = {}
    total = 0
    for bucket, cols in store.segment_columns(session, stream, first, stop):
        codes = cols.codes if wanted is None else cols.codes[np.isin(cols.devices, wanted)]
        total += codes.size
        if total > MAX_CODES:
            raise invalid(
                "query",
                "model",
                f"the window holds more than {MAX_CODES:,} readings: the prior no longer "
                "matters there; use AVG* (estimator=avg) or model=mean",
            )
        found.setdefault(bucket, []).append(codes.astype(np.int64))
    return {b: np.concatenate(parts) for b, parts in found.items()}


def bayes_reader(params: Zeal, model: str, prior_text: str | None, level: float) -> Reader:
    """The function that turns one window's figures into its posterior summary."""
    prior = _prior(model, prior_text)

    def read(n: int, average: float | None, codes: np.ndarray | None) -> BayesOut | None:
        if n == 0:
            return None
        try:
            found = _posterior(n, average, codes)
        except ParameterError as exc:
            raise invalid("query", "model", f"no {model} posterior: {exc}") from exc
        return BayesOut(
            model=model,
            assumes=ASSUMES[model],
            prior=found.prior,
            mean=found.mean,
            median=found.median,
            interval=found.interval,
            level=found.level,
            n=found.n,
        )

    def _posterior(n: int, average: float | None, codes: np.ndarray | None) -> Posterior:
        found: Posterior
        if model == "mean":
            assert average is not None
            normal = prior if isinstance(prior, NormalPrior) else None
            found = mean_posterior(params, n, average, prior=normal, level=level)
        elif model == "binary":
            assert codes is not None
            assert isinstance(prior, tuple)
            found = binary_posterior(params, codes, prior=prior, level=level)
        else:
            assert codes is not None
            normal = prior if isinstance(prior, NormalPrior) else None
            found = constant_posterior(params, codes, prior=normal, level=level)
        return found

    return read


def selected_devices(
    session: Session, stream: Stream, group: str | None, device: str | None
) -> store.Devices:
    """The devices a window read asks for: a group, one device, or all (None)."""
    if group is not None and device is not None:
        raise invalid("query", "device", "give a group or a device, not both")
    if device is not None:
        return device_ids(session, stream, device)
    return devices_in(session, stream, group)


def device_ids(session: Session, stream: Stream, device: str) -> list[int]:
    """One device of the stream as a device filter (a 422 if the stream has no such one)."""
    found = store.device_by_name(session, stream, device)
    if found is None:
        raise invalid("query", "device", f"no device named {device!r} in this stream")
    return [found.id]
