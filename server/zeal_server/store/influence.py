"""Devices whose own readings prove them dishonest, so an operator can leave them out.

An honest device's readings lie in [lower, upper], so the mean of its readings does too.
Its AVG* is unbiased for that mean, and the guaranteed (Bernstein, paper 001 Theorem 3)
interval at level 1 - PROOF covers it except with probability PROOF. A device whose interval
lies wholly outside the range has therefore sent codes that no honest device produces but
with probability at most PROOF: a device sending only the maximal code (the LDP poisoning
of Cao, Jia and Gong 2021) averages far above the range within a few dozen readings. The
test is one-sided in what it proves: a device that poisons within the range is not caught,
and its weight is bounded only by the stream's policy (readings per day).
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import numpy.typing as npt
from sqlalchemy import select
from sqlalchemy.orm import Session

from zeal import Zeal
from zeal_server.store.models import Device, Stream
from zeal_server.store.sums import Devices, DeviceSums, device_sums

__all__ = ["ALL_TIME", "PROOF", "implausible", "without_implausible"]

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
    sums = device_sums(session, stream, first_bucket, stop_bucket, devices)
    flagged = [i for i, bad in zip(sums.order, implausible(params, sums), strict=True) if bad]
    if not flagged:
        return devices, []
    names = session.scalars(
        select(Device.name).where(Device.id.in_(flagged)).order_by(Device.name)
    ).all()
    kept = select(Device.id).where(Device.stream_id == stream.id, Device.id.not_in(flagged))
    if devices is not None:
        kept = kept.where(Device.id.in_(devices))
    return kept, list(names)
