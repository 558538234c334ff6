"""A device's privacy cap across streams: the server's default, the caps given to devices
and to device tags (operator token to change them), and one device's cap and its account
(today, the last 7, 30 and 365 days, since first seen).

A device is its name in every stream it sends to. Its cap is its own, else the lowest cap
of the tags its devices carry in any stream, else ZEAL_DEVICE_MAX_EPSILON_PER_DAY; the same
holds of its optional caps over any 30 and any 365 consecutive UTC days
(ZEAL_DEVICE_MAX_EPSILON_PER_30_DAYS, _365_DAYS), each on its own. The daily cap also sets
the device hour rule: no UTC hour holds more than the larger of a twelfth of it and one
reading of the stream (zeal.policy.device_hour_cap). Only the
device itself spends it: another broker login publishing under its name (where the broker
says who published: ZEAL_MQTT_LOGIN_PROPERTY) or a LoRaWAN device of that name has a ledger
of its own under the same cap (``others_spent_today``). The collectors apply a change
within 2 s (their sync).
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request
from pydantic import BaseModel, Field

from zeal.errors import ParameterError
from zeal.policy import MAX_EPSILON_PER_DAY, MICRO, day_of
from zeal.protocol import check_name
from zeal_server import store
from zeal_server.api.deps import READ, WRITE, Db, invalid
from zeal_server.api.schemas import Strict
from zeal_server.errors import StoreError

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/budgets", tags=["privacy budgets"])

Device = Annotated[str, Path(description="device id: 1-64 letters, digits, '_', '.' or '-'")]
Tag = Annotated[str, Path(description="a device tag as KEY:VALUE")]


class CapIn(Strict):
    """The caps to set: a field left out is left as it is; null removes that cap."""

    max_epsilon_per_day: float | None = Field(
        None,
        strict=True,
        description=f"the daily cap in epsilon, in (0, {MAX_EPSILON_PER_DAY:g}]; null removes "
        "this cap (the device then takes its tags' cap or the default); it also sets the "
        "device hour rule (the larger of a twelfth of it and one reading of the stream)",
    )
    max_epsilon_per_30_days: float | None = Field(
        None,
        strict=True,
        description="the cap over any 30 consecutive UTC days, as the daily cap",
    )
    max_epsilon_per_365_days: float | None = Field(
        None,
        strict=True,
        description="the cap over any 365 consecutive UTC days, as the daily cap",
    )

    def caps(self) -> dict[int, float | None]:
        """The caps given, by horizon in UTC days (store.budgets.store.CAP_COLUMNS)."""
        return {
            d: getattr(self, c) for d, c in store.CAP_COLUMNS.items() if c in self.model_fields_set
        }


class DeviceCapOut(BaseModel):
    device: str
    max_epsilon_per_day: float | None = Field(description="its own daily cap (null: none)")
    max_epsilon_per_30_days: float | None = Field(description="over 30 days (null: none)")
    max_epsilon_per_365_days: float | None = Field(description="over 365 days (null: none)")


class TagCapOut(BaseModel):
    tag: str = Field(description="KEY:VALUE")
    max_epsilon_per_day: float | None = Field(description="its daily cap (null: none)")
    max_epsilon_per_30_days: float | None = Field(description="over 30 days (null: none)")
    max_epsilon_per_365_days: float | None = Field(description="over 365 days (null: none)")


class BudgetsOut(BaseModel):
    default_max_epsilon_per_day: float | None = Field(
        description="ZEAL_DEVICE_MAX_EPSILON_PER_DAY: the cap of a device with no cap of its "
        "own or of its tags (null: none)"
    )
    default_max_epsilon_per_30_days: float | None = Field(
        description="ZEAL_DEVICE_MAX_EPSILON_PER_30_DAYS: the same over any 30 UTC days"
    )
    default_max_epsilon_per_365_days: float | None = Field(
        description="ZEAL_DEVICE_MAX_EPSILON_PER_365_DAYS: the same over any 365 UTC days"
    )
    devices: list[DeviceCapOut]
    tags: list[TagCapOut]


class DeviceBudgetOut(BaseModel):
    device: str
    max_epsilon_per_day: float | None = Field(description="its cap across streams (null: none)")
    source: str = Field(description="where the cap comes from: device, tag or default")
    tag: str | None = Field(description="the tag whose cap applies (source tag)")
    spent_today: float = Field(
        description="epsilon booked for its readings stamped today (UTC) over its streams "
        "with a policy"
    )
    remaining_today: float | None
    streams: list[str] = Field(description="the streams it sent to or is enrolled in")
    others_spent_today: dict[str, float] = Field(
        description="what others spent today under its name, each on a ledger of its own "
        "(never the device's): by identity, login:NAME (another broker login) or "
        "lorawan:DEVEUI (a LoRaWAN device)"
    )
    spent_last_7_days: float = Field(
        description="epsilon booked for its readings stamped in the last 7 UTC days, today "
        "included, over its streams with a policy (its own ledger)"
    )
    spent_last_30_days: float = Field(description="the same over the last 30 UTC days")
    spent_last_365_days: float = Field(description="the same over the last 365 UTC days")
    spent_since_first_seen: float = Field(
        description="the same since the first day it spent on (days older than 400 days "
        "behind the import window are kept as one total)"
    )
    first_seen: str | None = Field(
        description="the first UTC day it spent on, YYYY-MM-DD (null: never)"
    )
    max_epsilon_per_30_days: float | None = Field(
        description="its cap over any 30 consecutive UTC days (its own, its tags' or the "
        "default; null: none)"
    )
    max_epsilon_per_365_days: float | None = Field(
        description="its cap over any 365 consecutive UTC days (null: none)"
    )


def _default(request: Request) -> float | None:
    value: float | None = request.app.state.settings.device_max_epsilon_per_day
    return value


def _rolling(request: Request) -> dict[int, float | None]:
    value: dict[int, float | None] = request.app.state.settings.device_rolling_caps
    return value


def _changed(request: Request) -> None:
    if request.app.state.collector is not None:
        request.app.state.collector.caps_changed()


@router.get("", dependencies=READ, response_model=BudgetsOut)
def budgets(request: Request, db: Db) -> BudgetsOut:
    """The default device cap and the caps given to devices and to tags."""
    found = {days: store.overrides(db, days) for days in store.CAP_COLUMNS}
    devices = sorted({d for f in found.values() for d in f.devices})
    tags = sorted({t for f in found.values() for t in f.tags})
    rolling = _rolling(request)
    return BudgetsOut(
        default_max_epsilon_per_day=_default(request),
        default_max_epsilon_per_30_days=rolling.get(30),
        default_max_epsilon_per_365_days=rolling.get(365),
        devices=[
            DeviceCapOut(
                device=d, **{c: found[days].devices.get(d) for days, c in store.CAP_COLUMNS.items()}
            )
            for d in devices
        ],
        tags=[
            TagCapOut(
                tag=f"{k}:{v}",
                **{c: found[days].tags.get((k, v)) for days, c in store.CAP_COLUMNS.items()},
            )
            for k, v in tags
        ],
    )


def _budget_out(db: Db, request: Request, device: str) -> DeviceBudgetOut:
    try:
        found = store.device_budget(
            db, device, _default(request), day_of(store.now_ms()), _rolling(request)
        )
    except StoreError as exc:
        raise HTTPException(404, str(exc)) from None
    cap = found.max_epsilon_per_day
    spent = found.spent_micro / MICRO
    return DeviceBudgetOut(
        device=device,
        max_epsilon_per_day=cap,
        source=found.source,
        tag=found.tag,
        spent_today=spent,
        remaining_today=None if cap is None else max(0.0, cap - spent),
        streams=found.streams,
        others_spent_today={k: v / MICRO for k, v in found.others_micro.items()},
        spent_last_7_days=found.horizons_micro[7] / MICRO,
        spent_last_30_days=found.horizons_micro[30] / MICRO,
        spent_last_365_days=found.horizons_micro[365] / MICRO,
        spent_since_first_seen=found.lifetime_micro / MICRO,
        first_seen=None
        if found.first_day is None
        else dt.datetime.fromtimestamp(found.first_day * 86_400, dt.UTC).date().isoformat(),
        max_epsilon_per_30_days=found.rolling[30][0] if 30 in found.rolling else None,
        max_epsilon_per_365_days=found.rolling[365][0] if 365 in found.rolling else None,
    )


@router.get("/devices/{device}", dependencies=READ, response_model=DeviceBudgetOut)
def device_budget(device: Device, request: Request, db: Db) -> DeviceBudgetOut:
    """One device's cap across streams, where it comes from, and its account: its spend
    today (UTC), over the last 7, 30 and 365 days and since first seen."""
    return _budget_out(db, request, device)


def _given(body: CapIn) -> dict[int, float | None]:
    caps = body.caps()
    if not caps:
        raise invalid(
            "body",
            "max_epsilon_per_day",
            "give at least one of " + ", ".join(store.CAP_COLUMNS.values()),
        )
    return caps


@router.put("/devices/{device}", dependencies=WRITE, response_model=DeviceBudgetOut)
def set_device_cap(device: Device, body: CapIn, request: Request, db: Db) -> DeviceBudgetOut:
    """Give a device caps of its own (operator token): per UTC day, over 30 and over 365
    days, each field given set (null removes that cap), the others left as they are."""
    try:
        check_name("device", device)
    except ParameterError as exc:
        raise invalid("path", "device", str(exc)) from None
    for days, cap in _given(body).items():
        try:
            store.set_device_cap(db, device, cap, days=days)
        except StoreError as exc:
            raise invalid("body", store.CAP_COLUMNS[days], str(exc)) from None
    db.commit()
    _changed(request)
    return _budget_out(db, request, device)


@router.put("/tags/{tag}", dependencies=WRITE, response_model=BudgetsOut)
def set_tag_cap(tag: Tag, body: CapIn, request: Request, db: Db) -> BudgetsOut:
    """Cap every device carrying tag KEY:VALUE in any stream (operator token); null removes
    the cap. A device with several capped tags takes the lowest."""
    key, colon, value = tag.partition(":")
    if not colon:
        raise invalid("path", "tag", "a tag is KEY:VALUE")
    for days, cap in _given(body).items():
        try:
            store.set_tag_cap(db, key, value, cap, days=days)
        except StoreError as exc:
            where, field = (
                ("path", "tag") if "KEY:VALUE" in str(exc) else ("body", store.CAP_COLUMNS[days])
            )
            raise invalid(where, field, str(exc)) from None
    db.commit()
    _changed(request)
    return budgets(request, db)
