"""``zeal-server`` commands carried out by the running server over HTTP: ``streams show``,
``streams devices``, ``average``, ``series``, ``distribution`` and ``tail`` read it,
``streams release``, ``enroll`` and ``policy set`` change it; ``streams
create|list|delete|retention|delete-device`` and ``export`` do too unless given
``--local`` (zeal_server.cli.local)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from zeal.vocabulary import renamed
from zeal_server.cli.asking import Handler, ask, base, get, open_server, stream_path
from zeal_server.cli.common import (
    CREATE_FIELDS,
    READS,
    WRITES,
    Commands,
    add_server_argument,
    command,
    stream_line,
    unconfirmed,
    write_export,
)
from zeal_server.errors import RemoteError

__all__ = ["HANDLERS", "add_parsers"]


def add_parsers(commands: Commands, streams: Commands) -> None:
    """The commands that only ask the running server; `streams`: the streams command's
    actions (zeal_server.cli.local makes the command)."""
    show = command(streams, "show", "a stream's parameters" + READS, (), "read")
    show.add_argument("name", help="the stream")
    released = command(
        streams,
        "release",
        "release the agents halted on a stream (deleted or created anew under them, a policy "
        "above their ceiling) that wait for their server: its signed configuration says so, "
        "and they adopt it" + WRITES,
        (),
        "write",
    )
    released.add_argument("name", help="the stream")
    listed = command(streams, "devices", "a stream's devices" + READS, (), "read")
    listed.add_argument("name", help="the stream")
    listed.add_argument("--limit", type=int, default=100, help="devices shown [100]")
    for name, text in (
        ("average", "the debiased average over a window, with its interval"),
        ("series", "the average per interval, on the clock"),
        ("distribution", "the readings' histogram and quantiles over a window, with intervals"),
        ("tail", "the readings stored and the average, again every few seconds (Ctrl-C ends)"),
    ):
        p = command(commands, name, text + READS, (), "read")
        p.add_argument("stream", help="the stream")
        if name == "tail":
            p.add_argument("--every", type=float, default=5.0, help="seconds between lines [5]")
            p.add_argument("--count", type=int, help="stop after this many lines [never]")
            add_server_argument(p)
            continue
        p.add_argument("--start", help="window start, ISO 8601 (UTC if no zone)")
        p.add_argument("--end", help="window end, exclusive")
        p.add_argument("--group", help="devices with this tag, key:value")
        p.add_argument("--device", help="one device")
        if name == "series":
            p.add_argument(
                "--interval-seconds",
                dest="interval",
                type=int,
                help="seconds per point [the bucket]",
            )
            renamed(p, "--interval", "--interval-seconds", "interval")
            p.add_argument("--quantile", type=float, help="a quantile per point too, e.g. 0.9")
        if name == "distribution":
            p.add_argument("--bins", type=int, help="histogram bins [one code step wide each]")
            p.add_argument(
                "--quantiles", default="0.5,0.9,0.95", help="levels, comma-separated [0.5,0.9,0.95]"
            )
            p.add_argument("--above", type=float, help="a threshold: the share above it")
        add_server_argument(p)
    enroll = command(
        commands, "enroll", "let a device send to an enrolled-only stream" + WRITES, (), "write"
    )
    enroll.add_argument("stream", help="the stream")
    enroll.add_argument("device", help="the device")
    policy = command(
        commands, "policy", "a stream's privacy policy and a device's cap across streams", ()
    )
    actions = policy.add_subparsers(dest="action", required=True, metavar="ACTION")
    setting = command(
        actions,
        "set",
        "set the epsilon one device may spend per UTC day (a new fingerprint: agents take the "
        "new configuration by themselves)" + WRITES,
        (),
        "write",
    )
    setting.add_argument("stream", help="the stream")
    setting.add_argument("epsilon", type=float, help="epsilon per device per UTC day")
    device_cap = command(
        actions,
        "device",
        "give a device its own daily cap across all its streams (none: back to its tags' "
        "or the server's default)" + WRITES,
        (),
        "write",
    )
    device_cap.add_argument("device", help="the device")
    device_cap.add_argument("epsilon", type=_cap, help="epsilon per UTC day, or none")
    device_cap.add_argument(
        "--days",
        type=int,
        choices=(1, 30, 365),
        default=1,
        help="the cap's horizon: per UTC day (default; it also sets the device hour rule), or "
        "over any 30 or any 365 consecutive UTC days",
    )
    tag_cap = command(
        actions,
        "tag",
        "cap every device carrying a tag, in any stream (none: remove the cap)" + WRITES,
        (),
        "write",
    )
    tag_cap.add_argument("tag", help="KEY:VALUE")
    tag_cap.add_argument("epsilon", type=_cap, help="epsilon per UTC day, or none")
    tag_cap.add_argument(
        "--days", type=int, choices=(1, 30, 365), default=1, help="as for policy device"
    )
    budget = command(
        actions,
        "show",
        "a device's cap across streams and its spend: today, the last 7, 30 and 365 days, "
        "since first seen" + READS,
        (),
        "read",
    )
    budget.add_argument("device", help="the device")
    rejects = command(
        commands,
        "rejects",
        "who sent a stream's rejected messages (devices that never stored a reading too), "
        "with the reasons" + READS,
        (),
        "read",
    )
    rejects.add_argument("stream", help="the stream (or the name a device wrongly used)")
    rejects.add_argument("--limit", type=int, default=20, help="names shown [20]")
    for p in (show, released, listed, enroll, setting, device_cap, tag_cap, budget, rejects):
        add_server_argument(p)


def _estimate(out: Mapping[str, Any], unit: str = "") -> str:
    estimate = out.get("estimate")
    if not estimate:
        return "no readings"
    low, high = estimate["ci"]
    return (
        f"{estimate['mean']:.4g}{unit} ± {estimate['std_error']:.2g}{unit} "
        f"({out['confidence']:.0%} CI [{low:.4g}, {high:.4g}]{unit})"
    )


def _unit(args: argparse.Namespace, env: Mapping[str, str], name: str) -> str:
    """The stream's unit as printed after a value (" degF"; "" for none)."""
    unit = get(args, env, stream_path(name)).get("unit") or ""
    return f" {unit}" if unit else ""


def _show(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    s = get(args, env, stream_path(args.name))
    unit = f" {s['unit']}" if s["unit"] else ""
    print(f"{s['name']}: readings in [{s['lower']:g}, {s['upper']:g}]{unit}")
    print(
        f"  privacy        epsilon {s['epsilon']:g} per reading, policy "
        f"{s['max_epsilon_per_day']:g} per device per UTC day"
    )
    print(
        f"  bits           {s['payload_bits']} per reading on the wire, buckets of "
        f"{s['bucket_seconds']} s"
    )
    keep = "everything" if s["retention_days"] is None else f"{s['retention_days']} days"
    print(
        f"  retention      {keep}; enrolled devices only: {'yes' if s['enrolled_only'] else 'no'}"
    )
    print(f"  fingerprint    {s['fingerprint']} (created {s['created']})")


def _devices(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    out = get(args, env, f"{stream_path(args.name)}/devices", limit=args.limit)
    for d in out["devices"]:
        tags = ",".join(f"{k}:{v}" for k, v in sorted(d["tags"].items()))
        flags = f"  [{', '.join(d['flags'])}]" if d["flags"] else ""
        account = d.get("account") or {}
        month = account.get("last_30_days")
        spent = "" if month is None else f"  all streams 30 d {month:g}"
        print(
            f"{d['name']:<24} {d['readings']:>10,} readings  epsilon today "
            f"{d['epsilon_today']:g}{spent}  last seen {d['last_seen']}  {tags}{flags}"
        )
    total = out["total"]
    print(f"{len(out['devices'])} of {total} {'device' if total == 1 else 'devices'}")


def _window(args: argparse.Namespace) -> dict[str, Any]:
    return {"start": args.start, "end": args.end, "group": args.group, "device": args.device}


def _average(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    out = get(args, env, f"{stream_path(args.stream)}/average", **_window(args))
    unit = _unit(args, env, args.stream)
    print(f"{args.stream}: {_estimate(out, unit)} over {out['n']:,} readings")


def _series(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    out = get(
        args,
        env,
        f"{stream_path(args.stream)}/series",
        interval_seconds=args.interval,
        quantile=args.quantile,
        **_window(args),
    )
    unit = _unit(args, env, args.stream)
    for point in out["points"]:
        quantile = f"  {_quantile(point['quantile'], unit)}" if point.get("quantile") else ""
        line = _estimate({**out, **point}, unit)
        print(f"{point['start']}  {point['n']:>8,}  {line}{quantile}")
    if not out["points"]:
        print(f"{args.stream}: no readings in that window")


def _quantile(item: Mapping[str, Any], unit: str = "") -> str:
    ends = "" if item["low"] is None else f" [{item['low']:.4g}, {item['high']:.4g}]{unit}"
    return f"q{item['q']:g} {item['value']:.4g}{unit}{ends}"


def _distribution(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    out = get(
        args,
        env,
        f"{stream_path(args.stream)}/distribution",
        bins=args.bins,
        quantiles=args.quantiles,
        above=args.above,
        **_window(args),
    )
    unit = _unit(args, env, args.stream)
    measured = f", in{unit}" if unit else ""
    devices = f"{out['devices']:,} {'device' if out['devices'] == 1 else 'devices'}"
    print(f"{args.stream}: {out['n']:,} readings from {devices}{measured}")
    edges, shares = out["edges"], out["probabilities"]
    widest = max(shares) or 1.0
    for i, share in enumerate(shares):
        bar = "#" * round(40 * share / widest)
        print(f"  [{edges[i]:>9.4g}, {edges[i + 1]:>9.4g})  {share:6.1%}  {bar}")
    for item in out["quantiles"]:
        print(f"  {_quantile(item, unit)}")
    if out["above"]:
        a = out["above"]
        ends = "" if a["low"] is None else f" [{a['low']:.1%}, {a['high']:.1%}]"
        print(f"  above {a['threshold']:g}{unit}: {a['share']:.1%}{ends}")
    if out["intervals"]:
        print(f"  {out['intervals']}")


def _tail(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    shown = 0
    unit = _unit(args, env, args.stream)
    while args.count is None or shown < args.count:
        if shown:
            time.sleep(args.every)
        stats = get(args, env, f"{stream_path(args.stream)}/stats", efficiency="false")
        average = get(args, env, f"{stream_path(args.stream)}/average")
        print(
            f"{time.strftime('%H:%M:%S')}  readings {stats['readings']:,}  devices "
            f"{stats['devices']}  average {_estimate(average, unit)}",
            flush=True,
        )
        shown += 1


def _enroll(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    path = f"{stream_path(args.stream)}/devices/{urllib.parse.quote(args.device, safe='')}"
    ask(args, env, "PUT", path, None)
    print(f"{args.device} is enrolled on stream {args.stream}")


def _policy(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    out = ask(args, env, "PATCH", stream_path(args.stream), {"max_epsilon_per_day": args.epsilon})
    print(
        f"stream {args.stream}: at most {out['max_epsilon_per_day']:g} epsilon per device per "
        f"UTC day ({out['readings_per_day']} readings), fingerprint {out['fingerprint']}: "
        "agents take the new configuration by themselves"
    )


def _cap(text: str) -> float | None:
    return None if text.strip().lower() == "none" else float(text)


def _budget_line(out: Mapping[str, Any]) -> str:
    cap = out["max_epsilon_per_day"]
    where = {"device": "its own", "tag": f"tag {out['tag']}", "default": "the default"}
    return (
        f"device {out['device']}: "
        + ("no cap" if cap is None else f"at most {cap:g} epsilon per UTC day")
        + f" across its streams ({where[out['source']]}); {out['spent_today']:g} spent today"
        + (f" in {', '.join(out['streams'])}" if out["streams"] else "")
        + "".join(
            f"; {spent:g} spent under its name by {who} (its own ledger)"
            for who, spent in (out.get("others_spent_today") or {}).items()
        )
    )


def _account_line(out: Mapping[str, Any]) -> str:
    """Its account over the longer horizons (epsilon, its own ledger), and their caps."""
    first = out.get("first_seen")

    def capped(days: int) -> str:
        cap = out.get(f"max_epsilon_per_{days}_days")
        return "" if cap is None else f" (cap {cap:g})"

    return (
        f"spent in the last 7 days {out['spent_last_7_days']:g}, 30 days "
        f"{out['spent_last_30_days']:g}{capped(30)}, 365 days "
        f"{out['spent_last_365_days']:g}{capped(365)}; since first "
        f"seen {out['spent_since_first_seen']:g}" + (f" (since {first})" if first else "")
    )


def _field(days: int) -> str:
    return "max_epsilon_per_day" if days == 1 else f"max_epsilon_per_{days}_days"


def _horizon(days: int) -> str:
    return "per UTC day" if days == 1 else f"over any {days} UTC days"


def _device_cap(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    path = f"/budgets/devices/{urllib.parse.quote(args.device, safe='')}"
    out = ask(args, env, "PUT", path, {_field(args.days): args.epsilon})
    print(_budget_line(out))
    if args.days != 1:
        print(_account_line(out))


def _tag_cap(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    path = f"/budgets/tags/{urllib.parse.quote(args.tag, safe='')}"
    out = ask(args, env, "PUT", path, {_field(args.days): args.epsilon})
    caps = {t["tag"]: t[_field(args.days)] for t in out["tags"]}
    cap = caps.get(args.tag)
    print(
        f"tag {args.tag}: "
        + ("no cap of its own" if cap is None else f"at most {cap:g} epsilon {_horizon(args.days)}")
        + " for each device carrying it"
    )


def _budget(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    path = f"/budgets/devices/{urllib.parse.quote(args.device, safe='')}"
    out = get(args, env, path)
    print(_budget_line(out))
    print(_account_line(out))


def _create(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    body = {k: getattr(args, k) for k in CREATE_FIELDS}
    s = ask(args, env, "POST", "/streams", {k: v for k, v in body.items() if v is not None})
    print(
        f"created stream {s['name']} on {base(args, env)}: {s['payload_bits']} payload bits, "
        f"at most {s['max_epsilon_per_day']:g} epsilon per device per day, fingerprint "
        f"{s['fingerprint']} (the server retains its configuration on the broker within "
        "seconds)"
    )


def _list(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    streams = get(args, env, "/streams")
    if args.json:
        print(json.dumps([s["name"] for s in streams]))
        return
    for s in streams:
        print(stream_line(s))
    if not streams:
        print("no streams yet (zeal-server streams create --help)")


def _delete(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    get(args, env, stream_path(args.name))  # a missing stream is said before a confirmation
    if (refused := unconfirmed(args.confirm, args.name)) is not None:
        raise RemoteError(
            f"deleting stream {args.name!r} removes every reading stored for it; {refused}"
        )
    out = ask(args, env, "DELETE", stream_path(args.name), None, confirm=args.name)
    print(
        f"deleted stream {args.name} and its {out['readings']} readings (the server "
        "retains its signed tombstone on the broker within seconds: its agents halt)"
    )


def _retention(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    ask(args, env, "PATCH", stream_path(args.name), {"retention_days": args.days})
    kept = "everything" if args.days is None else f"the last {args.days} days"
    print(f"stream {args.name} keeps {kept} (the collector applies it within a minute)")


def _release(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    out = ask(args, env, "POST", f"{stream_path(args.name)}/release", None)
    print(
        f"released the agents halted on stream {args.name} at {out['released']}: those that "
        "wait for their server adopt its configuration within seconds (docs/edge-agent.md)"
    )


def _delete_device(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    path = f"{stream_path(args.name)}/devices/{urllib.parse.quote(args.device, safe='')}"
    get(args, env, stream_path(args.name))
    if (refused := unconfirmed(args.confirm, args.device)) is not None:
        raise RemoteError(
            f"deleting device {args.device!r} removes every reading it sent to "
            f"{args.name!r}; {refused}"
        )
    out = ask(args, env, "DELETE", path, None, confirm=args.device)
    print(f"deleted device {args.device} of stream {args.name} and its {out['readings']} readings")


def _export(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    window = {
        "start": None if args.start is None else args.start.isoformat(),
        "end": None if args.end is None else args.end.isoformat(),
        "format": args.kind,
        "times": args.times,
    }
    with open_server(
        args, env, "GET", f"{stream_path(args.stream)}/export", None, **window
    ) as response:
        if note := response.headers.get("Zeal-Estimates"):
            print(f"zeal-server: {note}", file=sys.stderr)
        sys.stdout.flush()
        write_export(iter(lambda: response.read(1 << 16), b""), args.out)


def _rejects(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    out = get(args, env, f"{stream_path(args.stream)}/rejects", limit=args.limit)
    for s in out["senders"]:
        reasons = ", ".join(f"{r} {n:,}" for r, n in s["reasons"].items())
        stored = "" if s["known"] else "  (never stored a reading)"
        print(f"{s['device']:<24} {s['messages']:>10,}  last {s['last']}  {reasons}{stored}")
    if out["other_senders"]:
        n = out["other_senders"]
        print(
            f"and {n:,} other {'name' if n == 1 else 'names'}: {out['other_messages']:,} messages"
        )
    if not out["senders"]:
        print(f"{args.stream}: no message rejected")


#: (command, action) -> its handler: every command of this family, listed once. Those of
#: them given --local are carried out on the database instead (zeal_server.cli.local).
HANDLERS: dict[tuple[str, str | None], Handler] = {
    ("streams", "show"): _show,
    ("streams", "devices"): _devices,
    ("streams", "release"): _release,
    ("streams", "create"): _create,
    ("streams", "list"): _list,
    ("streams", "delete"): _delete,
    ("streams", "retention"): _retention,
    ("streams", "delete-device"): _delete_device,
    ("average", None): _average,
    ("series", None): _series,
    ("distribution", None): _distribution,
    ("tail", None): _tail,
    ("enroll", None): _enroll,
    ("policy", "set"): _policy,
    ("policy", "device"): _device_cap,
    ("policy", "tag"): _tag_cap,
    ("policy", "show"): _budget,
    ("export", None): _export,
    ("rejects", None): _rejects,
}
