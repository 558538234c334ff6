"""The collector's writer fed directly: microseconds per one-reading message, on SQLite and
PostgreSQL, optionally beside the code of another commit measured in the same run.

A fresh database per database kind and code; a stream with a policy that refuses nothing;
`--devices` devices each reading once a second, one reading per message (the firmware
pattern), their messages in arrival order cut into transactions of `--per-transaction`
messages, each stored with ``Ingest.add_many`` in its own transaction and committed. The
first transactions warm the caches up (statements compiled, device rows made); the figure
is the median over the next `--transactions` of (transaction time / messages), commit
included, broker and acknowledgements left out. With ``--baseline COMMIT`` the same
measurement runs on that commit's server code (a git worktree, the same interpreter and
packages), alternated with this one, and the ratio is printed; with ``--without-cap`` this
checkout is alternated with itself without a device cap (the cap's own cost).

    .venv/bin/python bench/writer_cost.py [--devices 1000] [--per-transaction 20000]
        [--transactions 7] [--databases sqlite,postgresql] [--baseline COMMIT | --without-cap]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WARM_UP = 2


def measure(
    kind: str, devices: int, per_transaction: int, transactions: int, cap: bool = True
) -> dict[str, Any]:
    """Microseconds per message of each measured transaction, in a fresh database (`cap`
    False: this code without a device cap, ZEAL_DEVICE_MAX_EPSILON_PER_DAY none)."""
    from tools.testbed.databases import postgres_database
    from zeal import encode_batch
    from zeal.mqtt.topics import data_topic
    from zeal_server import store
    from zeal_server.ingest import Ingest
    from zeal_server.store.db import make_engine, migrate, session_factory

    with tempfile.TemporaryDirectory() as tmp:
        if kind == "sqlite":
            url, cleanup = f"sqlite:///{tmp}/writer.sqlite", None
        else:
            cleanup = postgres_database("zeal_writer")
            url = cleanup.__enter__()
        try:
            engine = make_engine(url)
            migrate(engine)
            sessions = session_factory(engine)
            with sessions() as session, session.begin():
                stream = store.create_stream(
                    session, name="w", lower=0, upper=100, epsilon=1, max_epsilon_per_day=86_400
                )
                params = store.params_of(stream)
            t0 = (stream.created_ms // 60_000 + 1) * 60_000
            rng = np.random.default_rng(1)
            names = [f"d{i:05d}" for i in range(devices)]
            topics = [data_topic("w", name) for name in names]
            total = (WARM_UP + transactions) * per_transaction
            codes = params.perturb(rng.uniform(0, 100, total), rng=rng)
            messages = []
            for k in range(total):
                second, d = divmod(k, devices)
                stamp = t0 + 1000 * second + d % 1000
                payload = encode_batch(
                    params,
                    stream="w",
                    device=names[d],
                    sequence=second,
                    codes=codes[k : k + 1],
                    timestamps=np.array([stamp]),
                )
                messages.append((topics[d], payload, stamp + 50))
            # A device cap across streams that refuses nothing, as the stream's policy: the
            # collector's default path books it (code from before it has none).
            capped = "device_max_epsilon_per_day" in inspect.signature(Ingest).parameters
            extra = {"device_max_epsilon_per_day": 86_400.0 if cap else None} if capped else {}
            ingest = Ingest(max_future_ms=600_000, **extra)
            # What a collector does every 2 s (here before every transaction, the worst
            # case): read the counter of cap changes and drop its cached caps when it moved;
            # code from before that counter read every cap again each time.
            versioned = hasattr(store, "caps_version")
            seen = None
            costs = []
            for n in range(WARM_UP + transactions):
                chunk = messages[n * per_transaction : (n + 1) * per_transaction]
                started = time.perf_counter()
                if versioned:
                    with sessions() as session:
                        version = store.caps_version(session)
                    if version != seen:
                        ingest.forget_caps()
                        seen = version
                elif capped:
                    ingest.forget_caps()
                with sessions() as session, session.begin():
                    outcomes = ingest.add_many(session, chunk)
                elapsed = time.perf_counter() - started
                if any(o.status != "stored" for o in outcomes):
                    raise SystemExit(f"not all stored: {outcomes[0]}")
                if n >= WARM_UP:
                    costs.append(1e6 * elapsed / len(chunk))
            engine.dispose()
        finally:
            if cleanup is not None:
                cleanup.__exit__(None, None, None)
    return {"database": kind, "us_per_message": costs, "median": statistics.median(costs)}


def run_code(
    code: Path | None,
    kind: str,
    devices: int,
    per_transaction: int,
    transactions: int,
    cap: bool = True,
) -> dict[str, Any]:
    """`measure` in a child process on the server code at `code` (None: this checkout)."""
    env = dict(os.environ)
    if code is not None:
        paths = [str(code / p) for p in ("server", "shared", "edge")]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    args = [sys.executable, __file__, "--child", kind, "--devices", str(devices)]
    args += ["--per-transaction", str(per_transaction), "--transactions", str(transactions)]
    args += [] if cap else ["--no-cap"]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{kind} on {code or 'this checkout'} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--per-transaction", type=int, default=20_000)
    parser.add_argument("--transactions", type=int, default=7)
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--baseline", help="a commit whose writer to measure alongside")
    parser.add_argument("--rounds", type=int, default=2, help="alternations with --baseline")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--without-cap",
        action="store_true",
        help="measure this checkout alongside itself without a device cap (instead of "
        "--baseline): the cap's own cost, ratios in one run",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--no-cap", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = measure(
            args.child, args.devices, args.per_transaction, args.transactions, not args.no_cap
        )
        print(json.dumps(result))
        return
    sizes = (args.devices, args.per_transaction, args.transactions)
    results: dict[str, Any] = {"devices": args.devices, "per_transaction": args.per_transaction}
    with tempfile.TemporaryDirectory() as tmp:
        baseline = None
        if args.baseline:
            baseline = Path(tmp) / "baseline"
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(baseline),
                 args.baseline],
                check=True,
            )  # fmt: skip
        try:
            for kind in args.databases.split(","):
                this: list[float] = []
                then: list[float] = []
                alongside = baseline is not None or args.without_cap
                for _ in range(args.rounds if alongside else 1):  # alternated
                    this.append(run_code(None, kind, *sizes)["median"])
                    if baseline is not None:
                        then.append(run_code(baseline, kind, *sizes)["median"])
                    elif args.without_cap:
                        then.append(run_code(None, kind, *sizes, cap=False)["median"])
                figure = {"this": statistics.median(this), "rounds": this}
                line = f"{kind}: this checkout {figure['this']:.1f} us/message"
                if then:
                    other = args.baseline or "without a device cap"
                    figure |= {"baseline": statistics.median(then), "baseline_rounds": then}
                    ratio = figure["baseline"] / figure["this"]
                    line += f", {other} {figure['baseline']:.1f} ({ratio:.2f}x)"
                print(line, flush=True)
                results[kind] = figure
        finally:
            if baseline is not None:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)],
                    check=False,
                )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
