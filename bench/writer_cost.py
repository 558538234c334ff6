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
packages), alternated with this one, and the ratio is printed. With ``--without-cap`` this
checkout runs beside itself without a device cap in one process, two databases fed the
same transactions in turn (``measure_pairs``), and the ratio is the median over the pairs
of `--rounds` such processes: the cap's own cost, with what the machine's other load does
between runs cancelled out of each pair.

    .venv/bin/python bench/writer_cost.py [--devices 1000] [--per-transaction 20000]
        [--transactions 7] [--databases sqlite,postgresql] [--baseline COMMIT | --without-cap]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
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

WARM_UP = 2


class Writer:
    """A fresh database (closed with `stack`) with a stream that refuses nothing and an
    Ingest over it (`cap` False: this code without a device cap,
    ZEAL_DEVICE_MAX_EPSILON_PER_DAY none), and the messages of `transactions` transactions
    of `per_transaction` one-reading messages from `devices` devices reading once a second,
    fed one transaction at a time (``step``)."""

    def __init__(
        self,
        stack: contextlib.ExitStack,
        kind: str,
        devices: int,
        per_transaction: int,
        transactions: int,
        cap: bool = True,
    ) -> None:
        from tools.testbed.databases import postgres_database
        from zeal import encode_batch
        from zeal.mqtt.topics import data_topic
        from zeal_server import store
        from zeal_server.ingest import Ingest
        from zeal_server.store.db import make_engine, migrate, session_factory

        if kind == "sqlite":
            url = f"sqlite:///{stack.enter_context(tempfile.TemporaryDirectory())}/w.sqlite"
        else:
            url = stack.enter_context(postgres_database("zeal_writer"))
        self.engine = make_engine(url)
        stack.callback(self.engine.dispose)
        migrate(self.engine)
        self.sessions = sessions = session_factory(self.engine)
        with sessions() as session, session.begin():
            stream = store.create_stream(
                session, name="w", lower=0, upper=100, epsilon=1, max_epsilon_per_day=86_400
            )
            params = store.params_of(stream)
        t0 = (stream.created_ms // 60_000 + 1) * 60_000
        rng = np.random.default_rng(1)
        names = [f"d{i:05d}" for i in range(devices)]
        topics = [data_topic("w", name) for name in names]
        total = transactions * per_transaction
        codes = params.perturb(rng.uniform(0, 100, total), rng=rng)
        # Messages as the collector hands them over: named (ingest.Message, as its inbox's
        # Received) where the code has them, plain tuples for code from before.
        make = getattr(importlib.import_module("zeal_server.ingest"), "Message", None)
        self.messages = []
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
            message = (topics[d], payload, stamp + 50)
            self.messages.append(message if make is None else make(*message))
        self.per_transaction = per_transaction
        # A device cap across streams that refuses nothing, as the stream's policy: the
        # collector's default path books it (code from before it has none).
        self.capped = "device_max_epsilon_per_day" in inspect.signature(Ingest).parameters
        extra = {"device_max_epsilon_per_day": 86_400.0 if cap else None} if self.capped else {}
        self.ingest = Ingest(max_future_ms=600_000, **extra)
        self.versioned = hasattr(store, "caps_version")
        self.seen: Any = None

    def step(self, n: int) -> float:
        """Store transaction `n`: microseconds per message, commit included."""
        from zeal_server import store

        chunk = self.messages[n * self.per_transaction : (n + 1) * self.per_transaction]
        # The garbage of what ran before is collected before, not during, the transaction;
        # the messages themselves are left out of the collector's scans (gc.freeze).
        gc.collect()
        gc.freeze()
        started = time.perf_counter()
        # What a collector does every 2 s (here before every transaction, the worst case):
        # read the counter of cap changes and drop its cached caps when it moved; code from
        # before that counter read every cap again each time.
        if self.versioned:
            with self.sessions() as session:
                version = store.caps_version(session)
            if version != self.seen:
                self.ingest.forget_caps()
                self.seen = version
        elif self.capped:
            self.ingest.forget_caps()
        with self.sessions() as session, session.begin():
            outcomes = self.ingest.add_many(session, chunk)
        elapsed = time.perf_counter() - started
        if any(o.status != "stored" for o in outcomes):
            raise SystemExit(f"not all stored: {outcomes[0]}")
        return 1e6 * elapsed / len(chunk)


def measure(
    kind: str, devices: int, per_transaction: int, transactions: int, cap: bool = True
) -> dict[str, Any]:
    """Microseconds per message of each measured transaction, in a fresh database."""
    with contextlib.ExitStack() as stack:
        writer = Writer(stack, kind, devices, per_transaction, WARM_UP + transactions, cap)
        costs = [writer.step(n) for n in range(WARM_UP + transactions)][WARM_UP:]
    return {"database": kind, "us_per_message": costs, "median": statistics.median(costs)}


def measure_pairs(
    kind: str, devices: int, per_transaction: int, transactions: int
) -> dict[str, Any]:
    """The writer with a device cap and without, each in a fresh database, fed the same
    transactions in turn (which goes first alternating): each pair's two figures are
    measured seconds apart, so what the machine's other load does between runs cancels
    out of their ratio."""
    total = WARM_UP + transactions
    with contextlib.ExitStack() as stack:
        capped = Writer(stack, kind, devices, per_transaction, total, cap=True)
        open_ = Writer(stack, kind, devices, per_transaction, total, cap=False)
        this, without = [], []
        for n in range(total):
            pair = (capped, open_) if n % 2 == 0 else (open_, capped)
            first, second = (w.step(n) for w in pair)
            a, b = (first, second) if n % 2 == 0 else (second, first)
            if n >= WARM_UP:
                this.append(a)
                without.append(b)
    return {"database": kind, "us_per_message": this, "without": without}


def run_code(
    code: Path | None,
    kind: str,
    devices: int,
    per_transaction: int,
    transactions: int,
    cap: bool = True,
    pairs: bool = False,
) -> dict[str, Any]:
    """`measure` (`pairs`: ``measure_pairs``) in a child process on the server code at
    `code` (None: this checkout)."""
    env = dict(os.environ)
    if code is not None:
        paths = [str(code / p) for p in ("server", "shared", "edge")]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    args = [sys.executable, __file__, "--child", kind, "--devices", str(devices)]
    args += ["--per-transaction", str(per_transaction), "--transactions", str(transactions)]
    args += ([] if cap else ["--no-cap"]) + (["--pairs"] if pairs else [])
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{kind} on {code or 'this checkout'} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def without_cap(kind: str, sizes: tuple[int, int, int], rounds: int) -> dict[str, Any]:
    """The cap's own cost: `rounds` child processes of ``measure_pairs``; the ratio is the
    median over every pair of (without a cap / with it)."""
    this: list[float] = []
    then: list[float] = []
    for _ in range(rounds):
        pairs = run_code(None, kind, *sizes, pairs=True)
        this += pairs["us_per_message"]
        then += pairs["without"]
    ratios = [b / a for a, b in zip(this, then, strict=True)]
    return {
        "this": statistics.median(this),
        "baseline": statistics.median(then),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "us_per_message": this,
        "without": then,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--per-transaction", type=int, default=20_000)
    parser.add_argument("--transactions", type=int, default=7)
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--baseline", help="a commit whose writer to measure alongside")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="alternations with --baseline; child processes with --without-cap",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--without-cap",
        action="store_true",
        help="measure this checkout alongside itself without a device cap (instead of "
        "--baseline), transaction by transaction in one process: the cap's own cost, the "
        "median of the pairs' ratios",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--no-cap", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pairs", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child and args.pairs:
        sizes_ = (args.devices, args.per_transaction, args.transactions)
        print(json.dumps(measure_pairs(args.child, *sizes_)))
        return
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
                if args.without_cap:
                    results[kind] = figure = without_cap(kind, sizes, args.rounds)
                    print(
                        f"{kind}: this checkout {figure['this']:.1f} us/message, without a "
                        f"device cap {figure['baseline']:.1f} ({figure['ratio']:.2f}x, the "
                        f"median of {len(figure['ratios'])} paired transactions)",
                        flush=True,
                    )
                    continue
                this: list[float] = []
                then: list[float] = []
                # Alternated, and which code goes first alternated too: on PostgreSQL the
                # first of two back-to-back runs was 12 % slower, the same code against
                # itself (--baseline HEAD gave 0.88x when this checkout always went first).
                for k in range(args.rounds if baseline is not None else 1):
                    first_this = k % 2 == 0 or baseline is None
                    if not first_this:
                        then.append(run_code(baseline, kind, *sizes)["median"])
                    this.append(run_code(None, kind, *sizes)["median"])
                    if first_this and baseline is not None:
                        then.append(run_code(baseline, kind, *sizes)["median"])
                figure = {"this": statistics.median(this), "rounds": this}
                line = f"{kind}: this checkout {figure['this']:.1f} us/message"
                if then:
                    figure |= {"baseline": statistics.median(then), "baseline_rounds": then}
                    ratio = figure["baseline"] / figure["this"]
                    line += f", {args.baseline} {figure['baseline']:.1f} ({ratio:.2f}x)"
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
