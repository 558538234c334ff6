"""``zeal-server`` commands that ask a running server over HTTP, as ``kubectl`` and ``influx``
do: ``streams show``, ``streams devices``, ``average``, ``series``, ``tail`` and
``lorawan list`` read it, ``enroll``, ``policy set`` and ``lorawan bind|unbind`` change it.
``streams create|list|delete|retention|delete-device`` and ``export`` do too, unless
given ``--local`` (:data:`UNLESS_LOCAL`), which opens the database instead, for
maintenance while no server runs.

They ask whichever database the server uses: ``--server URL`` (or ``ZEAL_SERVER_URL``,
default http://127.0.0.1:8000) with the read token (``ZEAL_READ_TOKEN``, else
``ZEAL_OPERATOR_TOKEN``; writes send ``ZEAL_OPERATOR_TOKEN``). They open no database and
need no other setting. Errors are one line, exit status 2 (as the rest of ``zeal-server``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.client import HTTPResponse
from typing import Any

from zeal_server.errors import RemoteError

__all__ = [
    "COMMANDS",
    "CREATE_FIELDS",
    "UNLESS_LOCAL",
    "RemoteError",
    "add_server_argument",
    "run",
    "stream_line",
    "unconfirmed",
]

DEFAULT_SERVER = "http://127.0.0.1:8000"
#: (command, action) pairs answered over HTTP; action None for a command without actions.
COMMANDS = frozenset(
    {
        ("streams", "show"),
        ("streams", "devices"),
        ("streams", "release"),
        ("average", None),
        ("series", None),
        ("tail", None),
        ("enroll", None),
        ("policy", "set"),
        ("lorawan", "bind"),
        ("lorawan", "list"),
        ("lorawan", "unbind"),
    }
)
#: Commands answered over HTTP unless given --local (then on the database directly).
UNLESS_LOCAL = frozenset(
    {
        ("streams", "create"),
        ("streams", "list"),
        ("streams", "delete"),
        ("streams", "retention"),
        ("streams", "delete-device"),
        ("export", None),
    }
)


def add_server_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=None,
        help=f"the running server's URL [env ZEAL_SERVER_URL; default {DEFAULT_SERVER}]",
    )


def _get(args: argparse.Namespace, env: Mapping[str, str], path: str, **query: Any) -> Any:
    return _ask(args, env, "GET", path, None, **query)


def _ask(
    args: argparse.Namespace,
    env: Mapping[str, str],
    method: str,
    path: str,
    body: dict[str, Any] | None,
    **query: Any,
) -> Any:
    with _open(args, env, method, path, body, **query) as response:
        return json.load(response)


def _base(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    return str(args.server or env.get("ZEAL_SERVER_URL") or DEFAULT_SERVER).rstrip("/")


@contextmanager
def _open(
    args: argparse.Namespace,
    env: Mapping[str, str],
    method: str,
    path: str,
    body: dict[str, Any] | None,
    **query: Any,
) -> Iterator[HTTPResponse]:
    base = _base(args, env)
    given = {k: v for k, v in query.items() if v is not None}
    url = f"{base}/api/v1{path}" + (f"?{urllib.parse.urlencode(given)}" if given else "")
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    reads = env.get("ZEAL_READ_TOKEN") or env.get("ZEAL_OPERATOR_TOKEN")
    token = reads if method == "GET" else env.get("ZEAL_OPERATOR_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        response = urllib.request.urlopen(request, timeout=30)
    except urllib.error.HTTPError as exc:
        try:
            detail = json.load(exc).get("detail")
        except (ValueError, AttributeError):
            detail = exc.reason
        if isinstance(detail, list):
            detail = "; ".join(str(d.get("msg", d)) for d in detail)
        raise RemoteError(f"{base} answered {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RemoteError(
            f"cannot reach the server at {base}: {reason} (is it running? --server or "
            "ZEAL_SERVER_URL names it; --local opens the database instead where a command "
            "has it)"
        ) from None
    with response:
        yield response


def unconfirmed(confirm: str | bool | None, name: str) -> str | None:
    """Why a deletion is not confirmed (None: it is). True is the old --yes."""
    if confirm is True or confirm == name:
        return None
    if confirm is None:
        return f"add --confirm {name} to confirm"
    return f"--confirm names {confirm!r}, not {name!r}"


def _stream(name: str) -> str:
    return f"/streams/{urllib.parse.quote(name, safe='')}"


def _estimate(out: Mapping[str, Any]) -> str:
    estimate = out.get("estimate")
    if not estimate:
        return "no readings"
    low, high = estimate["ci"]
    return (
        f"{estimate['mean']:.4g} ± {estimate['std_error']:.2g} "
        f"({out['confidence']:.0%} CI [{low:.4g}, {high:.4g}])"
    )


def _show(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    s = _get(args, env, _stream(args.name))
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
    out = _get(args, env, f"{_stream(args.name)}/devices", limit=args.limit)
    for d in out["devices"]:
        tags = ",".join(f"{k}:{v}" for k, v in sorted(d["tags"].items()))
        flags = f"  [{', '.join(d['flags'])}]" if d["flags"] else ""
        print(
            f"{d['name']:<24} {d['readings']:>10,} readings  epsilon today "
            f"{d['epsilon_today']:g}  last seen {d['last_seen']}  {tags}{flags}"
        )
    print(f"{len(out['devices'])} of {out['total']} devices")


def _window(args: argparse.Namespace) -> dict[str, Any]:
    return {"start": args.start, "end": args.end, "group": args.group, "device": args.device}


def _average(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    out = _get(args, env, f"{_stream(args.stream)}/average", **_window(args))
    print(f"{args.stream}: {_estimate(out)} over {out['n']:,} readings")


def _series(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    out = _get(
        args, env, f"{_stream(args.stream)}/series", interval_seconds=args.interval, **_window(args)
    )
    for point in out["points"]:
        print(f"{point['start']}  {point['n']:>8,}  {_estimate({**out, **point})}")


def _tail(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    shown = 0
    while args.count is None or shown < args.count:
        if shown:
            time.sleep(args.every)
        stats = _get(args, env, f"{_stream(args.stream)}/stats", efficiency="false")
        average = _get(args, env, f"{_stream(args.stream)}/average")
        print(
            f"{time.strftime('%H:%M:%S')}  readings {stats['readings']:,}  devices "
            f"{stats['devices']}  average {_estimate(average)}",
            flush=True,
        )
        shown += 1


def _enroll(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    path = f"{_stream(args.stream)}/devices/{urllib.parse.quote(args.device, safe='')}"
    _ask(args, env, "PUT", path, None)
    print(f"{args.device} is enrolled on stream {args.stream}")


def _policy(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    out = _ask(args, env, "PATCH", _stream(args.stream), {"max_epsilon_per_day": args.epsilon})
    print(
        f"stream {args.stream}: at most {out['max_epsilon_per_day']:g} epsilon per device per "
        f"UTC day ({out['readings_per_day']} readings), fingerprint {out['fingerprint']}: "
        "agents take the new configuration by themselves"
    )


#: The options of `streams create`, named as the fields of POST /streams.
CREATE_FIELDS = (
    *("name", "lower", "upper", "epsilon", "payload_bits", "exponent", "bucket_seconds"),
    *("description", "unit", "enrolled_only", "retention_days", "max_epsilon_per_day"),
)


def stream_line(s: Mapping[str, Any]) -> str:
    """One stream in `streams list`, from the API's answer or the store's row alike."""
    unit = f" {s['unit']}" if s["unit"] else ""
    return (
        f"{s['name']}  [{s['lower']:g}, {s['upper']:g}]{unit}  epsilon {s['epsilon']:g}  "
        f"{s['payload_bits']} bits  fingerprint {s['fingerprint']}"
    )


def _create(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    body = {k: getattr(args, k) for k in CREATE_FIELDS}
    s = _ask(args, env, "POST", "/streams", {k: v for k, v in body.items() if v is not None})
    print(
        f"created stream {s['name']} on {_base(args, env)}: {s['payload_bits']} payload bits, "
        f"at most {s['max_epsilon_per_day']:g} epsilon per device per day, fingerprint "
        f"{s['fingerprint']} (the server retains its configuration on the broker within "
        "seconds)"
    )


def _list(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    streams = _get(args, env, "/streams")
    if args.json:
        print(json.dumps([s["name"] for s in streams]))
        return
    for s in streams:
        print(stream_line(s))
    if not streams:
        print("no streams yet (zeal-server streams create --help)")


def _delete(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    _get(args, env, _stream(args.name))  # a missing stream is said before a confirmation
    if (refused := unconfirmed(args.confirm, args.name)) is not None:
        raise RemoteError(
            f"deleting stream {args.name!r} removes every reading stored for it; {refused}"
        )
    out = _ask(args, env, "DELETE", _stream(args.name), None, confirm=args.name)
    print(
        f"deleted stream {args.name} and its {out['readings']} readings (the server "
        "retains its signed tombstone on the broker within seconds: its agents halt)"
    )


def _retention(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    _ask(args, env, "PATCH", _stream(args.name), {"retention_days": args.days})
    kept = "everything" if args.days is None else f"the last {args.days} days"
    print(f"stream {args.name} keeps {kept} (the collector applies it within a minute)")


def _release(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    out = _ask(args, env, "POST", f"{_stream(args.name)}/release", None)
    print(
        f"released the agents halted on stream {args.name} at {out['released']}: those that "
        "wait for their server adopt its configuration within seconds (docs/edge-agent.md)"
    )


def _delete_device(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    path = f"{_stream(args.name)}/devices/{urllib.parse.quote(args.device, safe='')}"
    _get(args, env, _stream(args.name))
    if (refused := unconfirmed(args.confirm, args.device)) is not None:
        raise RemoteError(
            f"deleting device {args.device!r} removes every reading it sent to "
            f"{args.name!r}; {refused}"
        )
    out = _ask(args, env, "DELETE", path, None, confirm=args.device)
    print(f"deleted device {args.device} of stream {args.name} and its {out['readings']} readings")


def _export(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    window = {
        "start": None if args.start is None else args.start.isoformat(),
        "end": None if args.end is None else args.end.isoformat(),
    }
    with _open(args, env, "GET", f"{_stream(args.stream)}/export", None, **window) as response:
        if note := response.headers.get("Zeal-Estimates"):
            print(f"zeal-server: {note}", file=sys.stderr)
        sys.stdout.flush()
        while chunk := response.read(1 << 16):
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()


def _binding(args: argparse.Namespace) -> str:
    application = urllib.parse.quote(args.application, safe="")
    return f"/lorawan/bindings/{application}/{args.port}"


def _port(port: int) -> str:
    return "its other ports" if port == 0 else f"FPort {port}"


def _bind(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    body = {"stream": args.stream, "device_names": args.device_names}
    b = _ask(args, env, "PUT", _binding(args), body)
    print(
        f"uplinks of ChirpStack application {b['application_id']} on {_port(b['f_port'])} go to "
        f"stream {b['stream']}, devices named by {b['device_names']} (the collector takes "
        "it up at once)"
    )


def _bindings(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    bindings = _get(args, env, "/lorawan/bindings")
    for b in bindings:
        print(
            f"{b['application_id']}  {_port(b['f_port'])}  ->  {b['stream']}  "
            f"(devices by {b['device_names']})"
        )
    if not bindings:
        print("no LoRaWAN bindings yet (zeal-server lorawan bind --help)")


def _unbind(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    with _open(args, env, "DELETE", _binding(args), None):
        pass
    print(f"uplinks of application {args.application} on {_port(args.port)} are no longer stored")


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    action = getattr(args, "action", None)
    handler = {
        ("streams", "show"): _show,
        ("streams", "devices"): _devices,
        ("streams", "release"): _release,
        ("average", None): _average,
        ("series", None): _series,
        ("tail", None): _tail,
        ("enroll", None): _enroll,
        ("policy", "set"): _policy,
        ("streams", "create"): _create,
        ("streams", "list"): _list,
        ("streams", "delete"): _delete,
        ("streams", "retention"): _retention,
        ("streams", "delete-device"): _delete_device,
        ("export", None): _export,
        ("lorawan", "bind"): _bind,
        ("lorawan", "list"): _bindings,
        ("lorawan", "unbind"): _unbind,
    }[(args.command, action if args.command in ("streams", "policy", "lorawan") else None)]
    try:
        handler(args, env)
    except RemoteError as exc:
        print(f"zeal-server: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0
