"""Devices whose own readings prove them dishonest, so an operator can leave them out.

An honest device's readings lie in [lower, upper], so the mean of its readings does too.
Its AVG* is unbiased for that mean, and the guaranteed (Bernstein, paper 001 Theorem 3)
interval at level 1 - PROOF covers it except with probability PROOF. A device whose interval
lies wholly outside the range has therefore sent codes that no honest device produces but
with probability at most PROOF: a device sending only the maximal code (the LDP poisoning
of Cao, Jia and Gong 2021) averages far above the range within a few dozen readings. The
test is one-sided in what it proves: a device that poisons within the range is not caught,
and its weight is bounded only by the stream's policy (readings per day).

On a longitudinal stream (zeal.longitudinal) a device's readings repeat its memoized codes,
so they are not independent: the units are its distinct codes (each at least one draw; two
draws that gave one code, or codes of one block, are merged, which only widens the bound),
weighted by their share w of its readings. Bernstein's inequality over them, with variance
at most sum w**2 (V + step**2/4) and each moving the mean by at most w (M + step), gives the
interval; a device with one code is never flagged (any code can come from any reading).
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import numpy.typing as npt
from sqlalchemy import select
from sqlalchemy.orm import Session

from zeal import Zeal
from zeal.longitudinal import grid_step
from zeal_server.store.models import Device, Stream
from zeal_server.store.sums import Devices, DeviceSums, device_codes, device_sums

__all__ = ["ALL_TIME", "PROOF", "implausible", "implausible_ids", "without_implausible"]

#: The chance that one honest device is flagged in one check (1 in a billion).
PROOF: Final = 1e-9
#: Bucket numbers that include every stored bucket.
ALL_TIME: Final = (-(2**62), 2**62)


def implausible(params: Zeal, sums: DeviceSums, proof: float = PROOF) -> npt.NDArray[np.bool_]:
    """Per device of `sums` (in its order): whether its guaranteed interval at level
    1 - proof lies wholly outside [lower, upper]."""
    if not sums.counts:
        return np.zeros(0, dtype=bool)
    n = np.asarray(sums.counts, dtype=np.float64)
    means = params.decoded_sums(sums.counts, sums.sum_codes) / n
    log_term = math.log(2.0 / proof)
    a = log_term * params.error_bound() / 3
    half = (a + np.sqrt(a * a + 2 * n * log_term * params.variance_bound())) / n
    flagged: npt.NDArray[np.bool_] = (means - half > params.upper) | (means + half < params.lower)
    return flagged


def implausible_ids(
    session: Session, stream: Stream, params: Zeal, window: tuple[int, int], devices: Devices
) -> list[int]:
    """The ids of the devices (of `devices`, or all) whose readings in the window prove
    them dishonest (module docstring; on a longitudinal stream, by their codes)."""
    sums = device_sums(session, stream, *window, devices)
    if params.grid_points is None:
        return [i for i, bad in zip(sums.order, implausible(params, sums), strict=True) if bad]
    if not sums.counts:
        return []
    codes = device_codes(session, stream, params, window, devices)
    assert codes.ids.tolist() == list(sums.order)
    n = np.asarray(sums.counts, dtype=np.float64)
    means = params.decoded_sums(sums.counts, sums.sum_codes) / n
    weights = codes.counts / n[:, None]
    step = grid_step(params)
    log_term = math.log(2.0 / PROOF)
    a = log_term * (params.error_bound() + step) * weights.max(axis=1) / 3
    variance = (weights**2).sum(axis=1) * (params.variance_bound() + step * step / 4)
    half = a + np.sqrt(a * a + 2 * log_term * variance)
    flagged = (means - half > params.upper) | (means + half < params.lower)
    return [i for i, bad in zip(sums.order, flagged.tolist(), strict=True) if bad]


def without_implausible(  # noqa: PLR0917 (a window of a stream's devices)
    session: Session,
    stream: Stream,
    params: Zeal,
    first_bucket: int,
    stop_bucket: int,
    devices: Devices = None,
) -> tuple[Devices, list[str]]:
    """The devices (of `devices`, or all) less those whose readings in the window prove
    them dishonest, and the names of those left out (sorted)."""
    flagged = implausible_ids(session, stream, params, (first_bucket, stop_bucket), devices)
    if not flagged:
        return devices, []
    names = session.scalars(
        select(Device.name).where(Device.id.in_(flagged)).order_by(Device.name)
    ).all()
    kept = select(Device.id).where(Device.stream_id == stream.id, Device.id.not_in(flagged))
    if devices is not None:
        kept = kept.where(Device.id.in_(devices))
    return kept, list(names)
