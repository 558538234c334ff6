"""One home's sensor in three streams, for the device-cap tests: its streams, a batch of
one reading, and what the server stored and refused of a device."""

from __future__ import annotations

from fastapi.testclient import TestClient

from zeal import Zeal, encode_batch

#: The three streams of one home's sensor.
STREAMS = ("humidity", "occupancy", "temperature")


def one_reading(
    stream: str, device: str, sequence: int, stamp: int, policy: float | None = 8.0
) -> bytes:
    """A batch of one reading stamped `stamp` at epsilon 1 under `policy` (epsilon a day)."""
    params = Zeal(lower=0, upper=100, epsilon=1, max_epsilon_per_day=policy)
    return encode_batch(
        params,
        stream=stream,
        device=device,
        sequence=sequence,
        timestamps=[stamp],
        codes=params.perturb([50.0]),
    )


def totals(client: TestClient, device: str) -> tuple[int, dict[str, int]]:
    """Readings stored and rejects counted for `device` over the three streams."""
    stored, rejects = 0, {}
    for stream in STREAMS:
        devices = client.get(f"/api/v1/streams/{stream}/devices").json()["devices"]
        for d in devices:
            if d["name"] == device:
                stored += d["readings"]
                for reason, count in (d.get("rejects") or {}).items():
                    rejects[reason] = rejects.get(reason, 0) + count
    return stored, rejects
