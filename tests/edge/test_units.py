"""Unit tests of the agent's parts: settings, budget ledger, sources, outbox."""

from __future__ import annotations

import argparse
import io
import itertools
import re
import time
from pathlib import Path

import numpy as np
import pytest

from zeal import Zeal
from zeal_edge.budget import BudgetPolicy, micro_epsilon
from zeal_edge.errors import OutboxError
from zeal_edge.mqtt import parse_broker_url
from zeal_edge.outbox import Outbox
from zeal_edge.records import SealedBatch
from zeal_edge.settings import SettingsError, add_arguments, resolve
from zeal_edge.sources import CsvSource, LineSource, open_source

DATA = Path(__file__).resolve().parents[2] / "data" / "seattle-temps.csv"
NAMES = {"stream", "device", "batch", "batch_seconds", "broker", "budget_cap", "data_dir"}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, NAMES)
    return parser.parse_args(argv)


def test_settings_precedence_is_cli_then_env_then_file(tmp_path: Path) -> None:
    """Command line beats environment beats config file beats default."""
    config = tmp_path / "agent.toml"
    config.write_text('stream = "from-file"\ndevice = "d-file"\nbatch = 7\nbatch_seconds = 3.5\n')
    env = {"ZEAL_CONFIG": str(config), "ZEAL_DEVICE": "d-env", "ZEAL_BATCH": "8"}
    values = resolve(parse(["--batch", "9"]), env, NAMES, {"stream"})
    assert values["stream"] == "from-file"
    assert values["device"] == "d-env"
    assert values["batch"] == 9
    assert values["batch_seconds"] == 3.5
    assert values["broker"] == "mqtt://127.0.0.1:1883"
    assert values["budget_cap"] is None


def test_renamed_settings_still_work_for_a_release_and_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/api.md's vocabulary: --interval is --batch-seconds, ZEAL_DATA_DIR is the agent's
    ZEAL_EDGE_DATA_DIR (the server's ZEAL_DATA_DIR is another directory). The old names are
    read, each with a line on stderr; the new ones win over them."""
    values = resolve(parse(["--stream", "s", "--interval", "2"]), {}, NAMES, {"stream"})
    assert values["batch_seconds"] == 2.0
    assert "--interval is now --batch-seconds" in capsys.readouterr().err
    old_env = {"ZEAL_INTERVAL": "3", "ZEAL_DATA_DIR": "/old"}
    values = resolve(parse(["--stream", "s"]), old_env, NAMES, {"stream"})
    assert (values["batch_seconds"], values["data_dir"]) == (3.0, "/old")
    err = capsys.readouterr().err
    assert "ZEAL_INTERVAL is now ZEAL_BATCH_SECONDS" in err
    assert "ZEAL_DATA_DIR is now ZEAL_EDGE_DATA_DIR" in err
    both = {**old_env, "ZEAL_BATCH_SECONDS": "4", "ZEAL_EDGE_DATA_DIR": "/new"}
    values = resolve(parse(["--stream", "s"]), both, NAMES, {"stream"})
    assert (values["batch_seconds"], values["data_dir"]) == (4.0, "/new")
    assert capsys.readouterr().err == ""
    config = tmp_path / "agent.toml"
    config.write_text("interval = 5\n")
    values = resolve(parse(["--stream", "s", "--config", str(config)]), {}, NAMES, {"stream"})
    assert values["batch_seconds"] == 5.0
    assert "interval is now batch_seconds" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "--stream (or ZEAL_STREAM) is required"),
        (["--stream", "s", "--batch", "x"], {}, "--batch='x' is invalid"),
        (["--stream", "s"], {"ZEAL_BATCH_SECONDS": "-1"}, "ZEAL_BATCH_SECONDS='-1' is invalid"),
        (["--stream", "s"], {"ZEAL_INTERVAL": "-1"}, "ZEAL_INTERVAL='-1' is invalid"),
        (["--stream", "s", "--budget-cap", "nan"], {}, "--budget-cap='nan' is invalid"),
        (["--stream", "a+b"], {}, "stream name 'a+b' is invalid"),
    ],
)
def test_bad_settings_name_their_origin(argv: list[str], env: dict[str, str], message: str) -> None:
    """A missing or invalid setting raises SettingsError naming where it came from."""
    with pytest.raises(SettingsError, match=re.escape(message)):
        resolve(parse(argv), env, NAMES, {"stream"})


def test_trust_on_first_use_is_a_switch_and_anything_else_is_refused() -> None:
    """--trust-first-use alone says yes; ZEAL_TRUST_FIRST_USE takes yes or no; the default
    is no (an agent given no key adopts nothing)."""
    names = {*NAMES, "trust_first_use"}

    def trust(argv: list[str], env: dict[str, str]) -> object:
        parser = argparse.ArgumentParser()
        add_arguments(parser, names)
        return resolve(parser.parse_args(["--stream", "s", *argv]), env, names, set())[
            "trust_first_use"
        ]

    assert trust([], {}) is False
    assert trust(["--trust-first-use"], {}) is True
    assert trust([], {"ZEAL_TRUST_FIRST_USE": "yes"}) is True
    assert trust(["--trust-first-use", "no"], {"ZEAL_TRUST_FIRST_USE": "yes"}) is False
    with pytest.raises(SettingsError, match="ZEAL_TRUST_FIRST_USE='maybe' is invalid"):
        trust([], {"ZEAL_TRUST_FIRST_USE": "maybe"})


def test_unknown_config_file_keys_are_refused(tmp_path: Path) -> None:
    """A typo in the config file is an error, not silently ignored."""
    config = tmp_path / "agent.toml"
    config.write_text('strem = "x"\n')
    with pytest.raises(SettingsError, match="unknown settings"):
        resolve(parse([]), {"ZEAL_CONFIG": str(config)}, NAMES, set())


def test_broker_urls() -> None:
    """mqtt:// and mqtts:// URLs give host, port and TLS; credentials in URLs are refused."""
    assert parse_broker_url("mqtt://h").port == 1883
    tls = parse_broker_url("mqtts://h:9000")
    assert tls.tls
    assert tls.port == 9000
    for bad in ("http://h", "mqtt://", "mqtt://u:p@h", "mqtt://h:99999"):
        with pytest.raises(ValueError, match=r"broker URL|credentials"):
            parse_broker_url(bad)


def test_budget_is_integer_micro_epsilon_rounded_up() -> None:
    """Costs round up, caps round down: the ledger never under-counts."""
    assert micro_epsilon(1.0) == 1_000_000
    assert micro_epsilon(0.1) == 100_001  # 0.1 as a float is slightly above 1/10
    assert BudgetPolicy.from_epsilon(10.0, 60).cap_micro == 10_000_000
    policy = BudgetPolicy(10_000_000, 60)
    assert policy.allows(9_000_000, 1_000_000)
    assert not policy.allows(9_000_001, 1_000_000)
    assert BudgetPolicy(None, 60).allows(10**18, 10**6)
    with pytest.raises(ValueError, match="positive"):
        BudgetPolicy.from_epsilon(0.0, 60)


def test_budget_resumes_when_old_spend_leaves_the_window() -> None:
    """At the cap, sending resumes when enough of the oldest spend has expired."""
    policy = BudgetPolicy(3_000_000, 100)
    history = [(1000, 1_000_000), (1010, 2_000_000)]
    assert policy.resume_ms(history, 0, 1_000_000) == (1000 + 100 + 1) * 1000
    assert policy.resume_ms(history, 0, 2_000_000) == (1010 + 100 + 1) * 1000
    assert policy.resume_ms(history, 0, 4_000_000) is None


def test_csv_source_resumes_limits_and_skips_bad_rows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A CSV source starts at a saved offset, stops at a limit, skips and counts cells that
    are not finite numbers (text, empty, NaN, inf)."""
    path = tmp_path / "x.csv"
    path.write_text(
        "date,temp\n2010/01/01 00:00,1.5\n2010/01/01 01:00,oops\n"
        "2010/01/01 02:00,3.5\n2010/01/01 03:00,4.5\n2010/01/01 04:00,NaN\n"
        "2010/01/01 05:00,-Infinity\n2010/01/01 06:00,\n2010/01/01 07:00,1e999\n"
    )
    source = CsvSource(path, column="temp")
    with caplog.at_level("WARNING"):
        values = [(r.value, r.offset) for r in source]
    for row in (3, 6, 7, 8, 9):
        assert f"row {row}: column 'temp' is not a finite number" in caplog.text
    assert "oops" not in caplog.text  # a bad cell may hold a raw reading: never logged
    assert values == [(1.5, 1), (3.5, 3), (4.5, 4)]
    assert source.skipped == 5
    assert [r.value for r in CsvSource(path, column="temp", start=3)] == [4.5]
    assert [r.value for r in CsvSource(path, column="temp", limit=1)] == [1.5]
    with pytest.raises(ValueError, match="no column 'humidity'"):
        CsvSource(path, column="humidity")


def test_csv_replay_follows_the_recorded_pace() -> None:
    """Hourly data at a 36000x speed-up arrives 0.1 s apart, stamped on that schedule."""
    start = time.time()
    readings = list(CsvSource(DATA, column="temp", speedup=36000, limit=4))
    assert time.time() - start >= 0.25
    stamps = [r.timestamp_ms for r in readings]
    assert all(
        b is not None and a is not None and 95 <= b - a <= 105
        for a, b in itertools.pairwise(stamps)
    )


def test_line_source_parses_values_and_stamped_values() -> None:
    """Lines are VALUE or TIMESTAMP_MS,VALUE with a finite value; anything else is skipped
    and counted."""
    lines = io.StringIO(
        "1.5\n# comment\n1767225600000,2.5\nnot a number\n1,2,3\n\n3.5\nnan\n5,inf\nx,4\n"
    )
    source = LineSource(lines, "test")
    readings = list(source)
    assert [(r.timestamp_ms, r.value) for r in readings] == [
        (None, 1.5),
        (1767225600000, 2.5),
        (None, 3.5),
    ]
    assert source.skipped == 5
    with pytest.raises(ValueError, match="unknown source"):
        open_source("ftp:x")


def test_outbox_commits_atomically_and_in_sequence(tmp_path: Path) -> None:
    """A batch with the wrong sequence rolls the whole transaction back."""
    box = Outbox(tmp_path / "o.sqlite")
    ns = box.ensure("s", "d")
    box.commit_batches([SealedBatch(ns, 0, b"a", 3, 30, 5)], now_ms=1_000_000, fingerprint="f")
    with pytest.raises(OutboxError, match="not the next one"):
        box.commit_batches(
            [SealedBatch(ns, 1, b"b", 1, 10, 6), SealedBatch(ns, 5, b"c", 1, 10, 7)],
            now_ms=1_000_000,
            fingerprint="f",
        )
    assert box.next_sequence(ns) == 1
    assert box.source_offset(ns) == 5
    assert box.spent(ns, now_ms=1_000_000, window_s=60) == 30
    assert [p.payload for p in box.pending()] == [b"a"]
    box.acknowledge([(ns, 0), (ns, 0)])  # a duplicate PUBACK is harmless
    status = box.status()[0]
    assert (status.outbox_batches, status.sent_batches, status.sent_readings) == (0, 1, 3)
    assert box.spent(ns, now_ms=1_000_000 + 61_000, window_s=60) == 0
    box.close()


def test_the_per_second_spend_is_pruned_beyond_the_longest_budget_window(tmp_path: Path) -> None:
    """An agent committing a batch a second for an hour keeps at most its window (plus a
    minute between prunes) of per-second spend rows, never one inside the window; a longer
    window later keeps more from then on; the policy's day ledger is never pruned."""
    box = Outbox(tmp_path / "o.sqlite")
    ns = box.ensure("s", "d")
    box.set_policy(ns, cost_micro=10, cap_micro=None, window_s=60)
    t0 = 1_000_000_000
    for k in range(3600):
        batch = SealedBatch(ns, k, b"x", 1, 10, days=((t0 // 86_400_000, 10),))
        box.commit_batches([batch], now_ms=t0 + 1000 * k, fingerprint="f")
    now = t0 + 1000 * 3599
    rows = box._db.execute("SELECT COUNT(*) FROM spend").fetchone()[0]
    assert 60 <= rows <= 121
    assert box.spent(ns, now_ms=now, window_s=60) == 60 * 10  # the window is whole
    assert sum(box.spent_by_day(ns, 0).values()) == 3600 * 10  # the day ledger is not pruned
    box.set_policy(ns, cost_micro=10, cap_micro=None, window_s=600)
    for k in range(3600, 4800):
        box.commit_batches([SealedBatch(ns, k, b"x", 1, 10)], now_ms=t0 + 1000 * k, fingerprint="f")
    assert box.spent(ns, now_ms=t0 + 1000 * 4799, window_s=600) == 600 * 10
    box.set_policy(ns, cost_micro=10, cap_micro=None, window_s=60)  # kept stays at 600
    box.commit_batches([SealedBatch(ns, 4800, b"x", 1, 10)], now_ms=t0 + 4_860_000, fingerprint="f")
    # the rows of seconds 4261-4799 are still there: a shorter window does not prune them
    assert box.spent(ns, now_ms=t0 + 4_860_000, window_s=600) == (4799 - 4260) * 10 + 10
    box.close()


def test_the_batcher_seals_commits_and_queues_drafts_in_one_transaction(tmp_path: Path) -> None:
    """Drafts of several devices become decodable batches with each namespace's next
    sequence, committed together with their spend; sequences follow the outbox (a sequence
    reset moves them on); a draft of an unknown namespace commits nothing."""
    from zeal import decode_batch
    from zeal_edge.pipeline import Batcher, Draft

    params = Zeal(lower=0.0, upper=10.0, epsilon=1.0)
    box = Outbox(tmp_path / "o.sqlite")
    a, b = box.ensure("s", "a"), box.ensure("s", "b")
    queued: list[list[tuple[str, int]]] = []

    class Queue:  # the pipeline's side: what would be published next
        def committed(self, keys: list[tuple[str, int]]) -> None:
            queued.append(keys)

    batcher = Batcher(box, Queue())  # type: ignore[arg-type]
    codes = params.perturb(np.array([1.0, 2.0, 3.0]), rng=np.random.default_rng(1))
    sealed = batcher.commit(
        params, [Draft(a, [10, 20, 30], codes), Draft(b, [10, 20], codes[:2], 7)], now_ms=5000
    )
    assert [(s.namespace, s.sequence, s.readings) for s in sealed] == [(a, 0, 3), (b, 0, 2)]
    assert queued == [[(a, 0), (b, 0)]]
    batch = decode_batch(sealed[1].payload, params, stream="s", device="b")
    assert (batch.sequence, list(batch.codes)) == (0, list(codes[:2]))
    assert box.spent(b, now_ms=5000, window_s=60) == 2 * micro_epsilon(1.0)
    assert box.source_offset(b) == 7
    assert box.advance_sequence(a, 40)
    (again,) = batcher.commit(params, [Draft(a, [40], codes[:1])], now_ms=6000)
    assert again.sequence == 40
    with pytest.raises(OutboxError, match="no stream namespace"):
        batcher.commit(
            params, [Draft(a, [50], codes[:1]), Draft("s/c", [50], codes[:1])], now_ms=7000
        )
    assert box.next_sequence(a) == 41  # nothing of the failed call was committed
    box.close()


def test_a_batch_the_broker_had_no_subscriber_for_stays_and_is_sent_again(tmp_path: Path) -> None:
    """A PUBACK saying "no matching subscribers" (the collector's session is gone) is not a
    delivery: the batch stays in the outbox, nothing newer is sent while the pause lasts
    (1 s, then 2 s, ...), and after it the batch is sent again, first; once confirmed it
    leaves the outbox. A refused one stays for the next start; a confirmed one leaves."""
    import queue

    from zeal_edge.mqtt import Ack
    from zeal_edge.pipeline import Pipeline

    class Link:  # the connection's side: publishes recorded, acknowledgements fed by hand
        def __init__(self) -> None:
            self.acks: queue.SimpleQueue[Ack] = queue.SimpleQueue()
            self.sent: list[tuple[str, bytes]] = []

        def publish(self, topic: str, payload: bytes) -> int:
            self.sent.append((topic, payload))
            return len(self.sent)  # the mid

    box = Outbox(tmp_path / "o.sqlite")
    ns = box.ensure("s", "d")
    batches = [SealedBatch(ns, k, bytes([k]), 1, 10) for k in range(3)]
    box.commit_batches(batches, now_ms=1_000_000, fingerprint="f")
    now = [100.0]
    link = Link()
    pipe = Pipeline(box, link, window=1, clock=lambda: now[0])  # type: ignore[arg-type]
    pipe.pump()
    assert link.sent == [("zeal/v1/s/d/up", b"\x00")]
    link.acks.put(Ack(1, "unheard", "No matching subscribers"))
    assert pipe.pump() == []
    assert (len(link.sent), pipe.unacknowledged, pipe.unheard) == (1, 3, 1)  # paused
    now[0] += 0.99
    pipe.pump()
    assert len(link.sent) == 1
    now[0] += 0.02
    pipe.pump()
    assert link.sent[1] == ("zeal/v1/s/d/up", b"\x00")  # the same batch again, first
    link.acks.put(Ack(2, "unheard", "No matching subscribers"))
    pipe.pump()
    now[0] += 1.5  # the second pause is 2 s
    pipe.pump()
    assert len(link.sent) == 2
    now[0] += 0.6
    pipe.pump()
    assert link.sent[2] == ("zeal/v1/s/d/up", b"\x00")
    link.acks.put(Ack(3, "confirmed", "Success"))
    assert pipe.pump() == [(ns, 0)]
    assert link.sent[3] == ("zeal/v1/s/d/up", b"\x01")
    link.acks.put(Ack(4, "refused", "Not authorized"))
    pipe.pump()
    link.acks.put(Ack(5, "confirmed", "Success"))
    assert pipe.pump() == [(ns, 2)]
    assert [p.sequence for p in box.pending()] == [1]  # the refused one, for the next start
    assert (pipe.unacknowledged, pipe.refused, pipe.unheard) == (0, 1, 2)
    box.close()
