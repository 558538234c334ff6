"""A device's privacy cap across streams: who a device is (``principals``: its name and the
identity that sent under it), what it may spend per UTC day over every stream with a policy,
and what it spent (``principal_days``, booked by ``store.ledger.charge_devices``, kept 400
days behind the import window, then folded into the principal's ``retired_micro``): its
account today, over the last 7, 30 and 365 days and since first seen (``device_budget``).

An *account* is (device name, identity): identity "" is the device itself (its own login,
where the broker says who published: deploy/mosquitto's zeal_retain plugin; or anyone,
where it cannot), ``login:NAME`` another broker login that published under the device's
name (the fleet simulator's), ``lorawan:DEVEUI`` a LoRaWAN device (``identity_of``). Each
account has a ledger of its own under the name's cap, so a batch from another transport or
another login never spends the device's day.

A device's cap is its own (``set_device_cap``), else the lowest cap of the tags its
devices carry in any stream (``set_tag_cap``: the most protective wins), else the server's
default (ZEAL_DEVICE_MAX_EPSILON_PER_DAY; None: no device cap). Caps are kept in epsilon and
booked in integer micro-epsilon rounded down (zeal.policy.cap_micro), as a stream's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from zeal.errors import ParameterError
from zeal.policy import ROLLING, DeviceCaps, cap_micro, check_device_cap
from zeal_server.errors import StoreError
from zeal_server.store.fleet import MAX_TAG_KEY, MAX_TAG_VALUE
from zeal_server.store.models import (
    Device,
    DeviceTag,
    Principal,
    PrincipalDay,
    Stream,
    TagBudget,
)
from zeal_server.store.streams import insert_for
from zeal_server.store.versions import bump_caps

__all__ = [
    "CAP_COLUMNS",
    "COLUMNS",
    "HORIZONS",
    "Account",
    "BudgetOverrides",
    "DeviceBudget",
    "caps_of",
    "device_budget",
    "identity_of",
    "overrides",
    "principal_ids",
    "resolve_caps",
    "set_device_cap",
    "set_tag_cap",
    "spent_on",
]


def _checked(value: float | None, what: str) -> float | None:
    if value is None:
        return None
    try:
        return check_device_cap(value, what=what)
    except ParameterError as exc:
        raise StoreError(str(exc)) from exc


def _pairs(session: Session, query: Any) -> dict[Any, Any]:
    return {row[0]: row[1] for row in session.execute(query)}


#: Who spends a device's cap: (device name, identity) (the module docstring).
Account = tuple[str, str]


#: The identity of a message the broker should have named the publisher of and did not (a
#: Last Will: Mosquitto's plugins see no Will as it is published).
UNNAMED = "login:?"


def identity_of(device: str, login: str | None, lorawan: str | None = None) -> str:
    """The identity of a message under `device`'s name: its LoRaWAN DevEUI, else its broker
    login when it is not the device's own (None: the broker does not say who publishes; "":
    it says so of other messages, not of this one)."""
    if lorawan is not None:
        return f"lorawan:{lorawan}"
    if login is None or login == device:
        return ""
    return f"login:{login}" if login else UNNAMED


def principal_ids(session: Session, accounts: list[Account]) -> dict[Account, int]:
    """The principal ids of `accounts`, creating those that do not exist (in order:
    collectors lock new rows in one order)."""
    if not accounts:
        return {}
    wanted = sorted(set(accounts))
    names = sorted({name for name, _ in wanted})

    def read() -> dict[Account, int]:
        query = select(Principal.name, Principal.identity, Principal.id).where(
            Principal.name.in_(names)
        )
        return {(str(n), str(i)): int(p) for n, i, p in session.execute(query)}

    found = read()
    new = [a for a in wanted if a not in found]
    if new:
        session.execute(
            insert_for(session)(Principal).on_conflict_do_nothing(),
            [{"name": n, "identity": i} for n, i in new],
        )
        found = read()
    return {a: found[a] for a in wanted}


#: The column of each cap's horizon (UTC days) on principals and tag_budgets.
COLUMNS = CAP_COLUMNS = {
    1: "max_epsilon_per_day",
    **{days: f"max_epsilon_per_{days}_days" for days in ROLLING},
}


def _tag_caps(session: Session, names: list[str], days: int = 1) -> dict[str, tuple[float, str]]:
    """The lowest tag cap over `days` (1: the day; ROLLING), with its tag (KEY:VALUE), of
    each of `names` that carries such a capped tag in some stream (ties: the first tag in
    order)."""
    column = getattr(TagBudget, COLUMNS[days])
    rows = session.execute(
        select(Device.name, column, TagBudget.key, TagBudget.value)
        .join(DeviceTag, DeviceTag.device_id == Device.id)
        .join(TagBudget, (TagBudget.key == DeviceTag.key) & (TagBudget.value == DeviceTag.value))
        .where(Device.name.in_(names), column.is_not(None))
    )
    out: dict[str, tuple[float, str]] = {}
    for name, cap, key, value in rows:
        out[name] = min(out.get(name, (cap, f"{key}:{value}")), (float(cap), f"{key}:{value}"))
    return out


def resolve_caps(
    session: Session,
    names: list[str],
    default: float | None,
    rolling: Mapping[int, float | None] | None = None,
) -> dict[str, dict[int, float]]:
    """The caps in epsilon of device `names` by horizon (1, 30, 365 UTC days; a horizon
    left out: no cap), each its own: the name's, else its tags' lowest, else `default` for
    the day and `rolling`'s for 30 and 365 days. Reads only."""
    found: dict[str, dict[int, float]] = {name: {} for name in names}
    for horizon in (1, *ROLLING):
        fallback = default if horizon == 1 else (rolling or {}).get(horizon)
        column = getattr(Principal, COLUMNS[horizon])
        own = _pairs(
            session,
            select(Principal.name, column).where(
                Principal.name.in_(names), Principal.identity == "", column.is_not(None)
            ),
        )
        tags = _tag_caps(session, [n for n in names if n not in own], horizon)
        for name in names:
            cap = own.get(name, tags[name][0] if name in tags else fallback)
            if cap is not None:
                found[name][horizon] = float(cap)
    return found


def caps_of(
    session: Session,
    accounts: list[Account],
    default: float | None,
    rolling: Mapping[int, float | None] | None = None,
) -> dict[Account, tuple[int, DeviceCaps | None]]:
    """(principal id, caps in micro-epsilon or None for none) of each of `accounts`,
    creating the principals not known yet: the caps of the account's device name
    (``resolve_caps``)."""
    ids = principal_ids(session, accounts)
    found = resolve_caps(session, sorted({name for name, _ in ids}), default, rolling)
    out: dict[Account, tuple[int, DeviceCaps | None]] = {}
    for account, pid in ids.items():
        mine = found[account[0]]
        caps = DeviceCaps(
            None if 1 not in mine else cap_micro(mine[1]),
            tuple((days, cap_micro(mine[days])) for days in ROLLING if days in mine),
        )
        out[account] = (pid, caps if caps.any else None)
    return out


def spent_on(session: Session, principal_ids_: list[int], day: int) -> dict[int, int]:
    """Micro-epsilon booked per principal on UTC day `day`."""
    if not principal_ids_:
        return {}
    rows = session.execute(
        select(PrincipalDay.principal_id, PrincipalDay.micro).where(
            PrincipalDay.principal_id.in_(principal_ids_), PrincipalDay.period == day
        )
    )
    return {int(p): int(m) for p, m in rows}


def set_device_cap(
    session: Session, name: str, max_epsilon: float | None, *, days: int = 1
) -> None:
    """Give device `name` a cap of its own over `days` (1: per UTC day; 30 or 365: over
    any that many consecutive UTC days); None: back to its tags' or the default."""
    cap = _checked(max_epsilon, COLUMNS[_horizon(days)])
    pid = principal_ids(session, [(name, "")])[(name, "")]
    setattr(session.get_one(Principal, pid), COLUMNS[days], cap)
    bump_caps(session)


def _horizon(days: int) -> int:
    if days not in COLUMNS:
        raise StoreError(f"a device cap is per 1, 30 or 365 UTC days, not {days!r}")
    return days


def set_tag_cap(
    session: Session, key: str, value: str, max_epsilon: float | None, *, days: int = 1
) -> None:
    """Cap the devices carrying tag key:value over `days` (as set_device_cap; None: remove
    that cap, and the tag's row with its last cap)."""
    if not (0 < len(key) <= MAX_TAG_KEY and len(value) <= MAX_TAG_VALUE and ":" not in key):
        raise StoreError(
            f"a tag is KEY:VALUE with a key of 1 to {MAX_TAG_KEY} characters (no ':') and a "
            f"value of at most {MAX_TAG_VALUE}"
        )
    cap = _checked(max_epsilon, COLUMNS[_horizon(days)])
    row = session.get(TagBudget, (key, value))
    if row is None and cap is not None:
        row = TagBudget(key=key, value=value)
        session.add(row)
    if row is not None:
        setattr(row, COLUMNS[days], cap)
        if all(getattr(row, c) is None for c in COLUMNS.values()):
            session.delete(row)
        session.flush()
    bump_caps(session)


@dataclass(frozen=True)
class BudgetOverrides:
    """The caps given to devices and to tags (the rest take the default)."""

    devices: dict[str, float]
    tags: dict[tuple[str, str], float]


def overrides(session: Session, days: int = 1) -> BudgetOverrides:
    """The caps over `days` (1, 30 or 365: COLUMNS) given to devices and to tags."""
    own, tag = getattr(Principal, COLUMNS[_horizon(days)]), getattr(TagBudget, COLUMNS[days])
    devices = session.execute(
        select(Principal.name, own)
        .where(Principal.identity == "", own.is_not(None))
        .order_by(Principal.name)
    )
    tags = session.execute(
        select(TagBudget.key, TagBudget.value, tag)
        .where(tag.is_not(None))
        .order_by(TagBudget.key, TagBudget.value)
    )
    return BudgetOverrides(
        devices={str(n): float(c) for n, c in devices if c is not None},
        tags={(str(k), str(v)): float(c) for k, v, c in tags if c is not None},
    )


#: The rolling horizons of a device's account, in UTC days (today included).
HORIZONS = (7, 30, 365)


@dataclass(frozen=True)
class DeviceBudget:
    """One device's cap across streams and what it spent on a day."""

    device: str
    #: The cap in epsilon (None: no device cap) and where it comes from: "device", "tag"
    #: (with the tag) or "default".
    max_epsilon_per_day: float | None
    source: str
    tag: str | None
    spent_micro: int
    #: Its streams (those it sent to or is enrolled in).
    streams: list[str]
    #: What others spent under its name that day, by identity (each its own ledger).
    others_micro: dict[str, int]
    #: Its own spend (micro-epsilon) over the last N UTC days up to `day` (N in HORIZONS,
    #: `day` included; readings stamped after `day` count too), and since first seen.
    horizons_micro: dict[int, int]
    lifetime_micro: int
    #: The first UTC day it spent on (None: never).
    first_day: int | None
    #: Its caps over any 30 and 365 consecutive UTC days (ROLLING), each (epsilon, source,
    #: tag) as the day's; a horizon without a cap is left out.
    rolling: dict[int, tuple[float, str, str | None]] = field(default_factory=dict)


def _cap_source(
    row: Principal | None, tags: dict[str, tuple[float, str]], name: str, days: int, default: Any
) -> tuple[float | None, str, str | None]:
    """(cap, source, tag) of device `name` over `days` (the module docstring's order)."""
    own = None if row is None else getattr(row, COLUMNS[days])
    if own is not None:
        return float(own), "device", None
    if name in tags:
        cap, tag = tags[name]
        return cap, "tag", tag
    return default, "default", None


def device_budget(
    session: Session,
    name: str,
    default: float | None,
    day: int,
    rolling: Mapping[int, float | None] | None = None,
) -> DeviceBudget:
    """Device `name`'s caps (`default` the day's and `rolling` the longer horizons' where
    neither the device nor a tag has one) and its spend on UTC day `day` (StoreError if no
    stream knows it and it has no cap of its own)."""
    streams = list(
        session.scalars(
            select(Stream.name)
            .join(Device, Device.stream_id == Stream.id)
            .where(Device.name == name)
            .order_by(Stream.name)
        )
    )
    rows = {p.identity: p for p in session.scalars(select(Principal).where(Principal.name == name))}
    if not rows and not streams:
        raise StoreError(f"no device {name!r} in any stream")
    row = rows.get("")
    cap, source, tag = _cap_source(row, _tag_caps(session, [name]), name, 1, default)
    longer = {}
    for horizon in ROLLING:
        tags = _tag_caps(session, [name], horizon)
        found = _cap_source(row, tags, name, horizon, (rolling or {}).get(horizon))
        if found[0] is not None:
            longer[horizon] = (float(found[0]), found[1], found[2])
    spent = spent_on(session, [p.id for p in rows.values()], day)
    others = {i: spent[p.id] for i, p in sorted(rows.items()) if i and p.id in spent}
    own = 0 if row is None else spent.get(row.id, 0)
    days: list[tuple[int, int]] = []
    if row is not None:
        days = [
            (int(d), int(m))
            for d, m in session.execute(
                select(PrincipalDay.period, PrincipalDay.micro).where(
                    PrincipalDay.principal_id == row.id
                )
            )
        ]
    horizons = {n: sum(m for d, m in days if d > day - n) for n in HORIZONS}
    retired = 0 if row is None else int(row.retired_micro or 0)
    firsts = [d for d, m in days if m > 0]
    if row is not None and row.first_day is not None:
        firsts.append(int(row.first_day))
    return DeviceBudget(
        name,
        cap,
        source,
        tag,
        own,
        streams,
        others,
        horizons_micro=horizons,
        lifetime_micro=retired + sum(m for _, m in days),
        first_day=min(firsts) if firsts else None,
        rolling=longer,
    )
