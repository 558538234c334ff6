"""A stream's devices: the list, groups, enrolment, tags, and deleting one device's data."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response

from zeal.policy import MICRO, day_of, micro_epsilon
from zeal_server import store
from zeal_server.api.deps import (
    API,
    READ,
    WRITE,
    Confirm,
    Db,
    as_datetime,
    confirmed,
    invalid,
    stream_or_404,
)
from zeal_server.api.schemas import HEAVY, DeletedOut, DeviceOut, DevicesOut, GroupOut, TagsIn
from zeal_server.store.models import Device, Stream

__all__ = ["router"]

log = logging.getLogger(__name__)
router = APIRouter()


def device_out(
    device: Device,
    epsilon: float,
    today: int = 0,
    flags: list[str] | None = None,
    rejects: dict[str, int] | None = None,
    account: tuple[int, ...] | None = None,
) -> DeviceOut:
    """`today`: the device's readings stamped in the current UTC day; `account`: its
    account across streams (store.accounts, micro-epsilon)."""
    cost = micro_epsilon(epsilon)
    # A longitudinal stream's device has paid for each code it sent once (ingest.memo).
    paid = (
        device.readings
        if device.memo_codes is None
        else sum(bin(b).count("1") for b in bytes(device.memo_codes))
    )
    return DeviceOut(
        name=device.name,
        tags=json.loads(device.tags),
        first_seen=as_datetime(device.first_seen_ms),
        last_seen=as_datetime(device.last_seen_ms),
        readings=device.readings,
        batches=device.batches,
        epsilon_spent=paid * cost / MICRO,
        epsilon_today=today * cost / MICRO,
        flags=flags or [],
        duplicates=device.duplicates,
        sequence_resets=device.sequence_resets,
        missing=device.missing,
        late=device.late,
        rejects=rejects or {},
        account={
            c: v / MICRO
            for (c, _), v in zip(
                store.ACCOUNT_COLUMNS, account or (0,) * len(store.ACCOUNT_COLUMNS), strict=True
            )
        },
    )


@router.delete(
    f"{API}/streams/{{name}}/devices/{{device}}",
    dependencies=WRITE,
    response_model=DeletedOut,
    responses={422: {"description": "confirm missing or not the device's name"}},
)
def delete_device(
    name: str, device: str, request: Request, db: Db, confirm: Confirm = None
) -> DeletedOut:
    """Delete everything stored of one device of the stream (operator token;
    confirm=DEVICE): its readings leave every average, and the other devices' data is
    untouched. Revoke its broker login first, or what it sends next is stored anew."""
    stream = stream_or_404(db, name)
    row = store.device_by_name(db, stream, device)
    if row is None:
        raise HTTPException(404, f"no device {device[:64]!r} in stream {name!r}")
    confirmed(confirm, device)
    readings = store.delete_device_data(db, stream, row)
    db.commit()
    if request.app.state.collector is not None:
        request.app.state.collector.devices_changed()
    log.warning("device %s of stream %s deleted (%d readings)", device, name, readings)
    return DeletedOut(stream=name, device=device, readings=readings)


@router.get(
    f"{API}/streams/{{name}}/devices", dependencies=READ, response_model=DevicesOut, responses=HEAVY
)
def devices(
    name: str,
    db: Db,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    sort: Annotated[
        Literal[
            "name",
            "first_seen",
            "last_seen",
            "readings",
            "epsilon_spent",
            "missing",
            "account_last_7_days",
            "account_last_30_days",
            "account_last_365_days",
            "account_since_first_seen",
        ],
        Query(
            description="column to order by (epsilon_spent orders as readings; account_*: "
            "the device's spend over all its streams in that horizon)"
        ),
    ] = "name",
    descending: bool = False,
) -> DevicesOut:
    """Devices of the stream with what each sent and its epsilon spent, one page."""
    stream = stream_or_404(db, name)
    total = store.count_devices(db, stream)
    day = day_of(store.now_ms())
    rows = store.device_page(
        db, stream, sort=sort, descending=descending, limit=limit, offset=offset, today=day
    )
    today = store.readings_on_day(db, [d.id for d in rows], day)
    accounts = store.accounts_of(db, [d.name for d in rows], day)
    rejects = store.device_rejects(db, stream.name, [d.name for d in rows])
    flags = _flags(db, stream, rows, today, rejects)
    return DevicesOut(
        total=total,
        limit=limit,
        offset=offset,
        devices=[
            device_out(
                d,
                stream.epsilon,
                today.get(d.id, 0),
                flags[d.id],
                rejects.get(d.name),
                accounts.get(d.name),
            )
            for d in rows
        ],
    )


def _one_out(db: Db, stream: Stream, row: Device) -> DeviceOut:
    """One device as the devices list shows it (today's epsilon and flags included)."""
    day = day_of(store.now_ms())
    today = store.readings_on_day(db, [row.id], day)
    rejects = store.device_rejects(db, stream.name, [row.name])
    flags = _flags(db, stream, [row], today, rejects)
    account = store.accounts_of(db, [row.name], day).get(row.name)
    return device_out(
        row, stream.epsilon, today.get(row.id, 0), flags[row.id], rejects.get(row.name), account
    )


def _flags(
    db: Db,
    stream: Stream,
    rows: list[Device],
    today: dict[int, int],
    rejects: dict[str, dict[str, int]],
) -> dict[int, list[str]]:
    """Per device of the page: `implausible` (its readings so far prove it dishonest),
    `over_budget` (batches of it were refused at the policy), `device_cap` (batches of it
    were refused at its cap across streams), `at_cap` (today's readings,
    or those of one of today's UTC hours, reached what the policy allows)."""
    params = store.params_of(stream)
    bad = set(store.implausible_ids(db, stream, params, store.ALL_TIME, [d.id for d in rows]))
    refused = {name for name, reasons in rejects.items() if "over_budget" in reasons}
    capped = {name for name, reasons in rejects.items() if "device_cap" in reasons}
    allowed, hourly = params.readings_per_day, params.readings_per_hour
    ids, day = [d.id for d in rows], day_of(store.now_ms())
    full = set() if hourly is None else store.hours_at_cap(db, ids, day, hourly)
    return {
        d.id: [
            flag
            for flag, raised in (
                ("implausible", d.id in bad),
                ("over_budget", d.name in refused),
                ("device_cap", d.name in capped),
                ("at_cap", d.id in full or (allowed is not None and today.get(d.id, 0) >= allowed)),
            )
            if raised
        ]
        for d in rows
    }


@router.get(f"{API}/streams/{{name}}/groups", dependencies=READ, response_model=list[GroupOut])
def groups(name: str, db: Db) -> list[GroupOut]:
    """The device groups (tag key:value pairs) of the stream, for the group filter."""
    stream = stream_or_404(db, name)
    return [GroupOut(group=g, devices=n) for g, n in store.groups(db, stream).items()]


@router.put(
    f"{API}/streams/{{name}}/devices/{{device}}",
    dependencies=WRITE,
    response_model=DeviceOut,
    responses={201: {"model": DeviceOut, "description": "enrolled"}},
)
def enroll(name: str, device: str, request: Request, response: Response, db: Db) -> DeviceOut:
    """Enroll a device (operator token): on a stream created with enrolled_only, only
    enrolled devices may send. 201 when it is new, 200 when it exists already. On a NATS
    deployment (ZEAL_NATS_URL) a name with a '.' is refused."""
    if request.app.state.settings.nats_servers and (
        problem := store.name_problem("device", device)
    ):
        raise invalid("path", "device", problem)
    stream = stream_or_404(db, name)
    try:
        row, created = store.enroll(db, stream, device)
    except store.StoreError as exc:
        raise invalid("path", "device", str(exc)) from exc
    db.commit()
    response.status_code = 201 if created else 200
    return _one_out(db, stream, row)


@router.put(
    f"{API}/streams/{{name}}/devices/{{device}}/tags",
    dependencies=WRITE,
    response_model=DeviceOut,
)
def set_tags(name: str, device: str, body: TagsIn, db: Db) -> DeviceOut:
    """Replace a device's tags (operator token); tags group devices in queries."""
    stream = stream_or_404(db, name)
    try:
        store.check_tags(body.tags)
    except store.StoreError as exc:
        raise invalid("body", "tags", str(exc)) from exc
    row = store.device_by_name(db, stream, device)
    if row is None:
        raise HTTPException(
            404,
            f"no device {device[:64]!r} in stream {name!r} (devices "
            "appear with their first valid data)",
        )
    store.set_tags(db, row, body.tags)
    db.commit()
    return _one_out(db, stream, row)
