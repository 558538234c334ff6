"""The collector's commit lags: the /metrics histogram counts every message, and the health
details summarise exactly the most recent RECENT_LAGS of them, whatever the commits' sizes."""

from __future__ import annotations

import time

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from zeal_server.broker.lags import LAG_BUCKETS, RECENT_LAGS, CommitLags


def histogram(lags: CommitLags) -> dict[str, float]:
    """The histogram's samples as Prometheus's own parser reads them."""
    registry = CollectorRegistry()
    registry.register(lags)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {
        f"{s.name}{s.labels.get('le', '')}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_histogram_counts_each_message_of_a_commit_in_its_bucket() -> None:
    lags = CommitLags()
    committed = float(int(time.time() * 1000))
    lags.observe_many(committed, [int(committed) - 3, int(committed) - 700, int(committed) + 5])
    samples = histogram(lags)
    assert samples["zeal_collector_commit_lag_seconds_count"] == 3
    assert samples["zeal_collector_commit_lag_seconds_bucket0.005"] == 2  # 3 ms; ahead: 0
    assert samples["zeal_collector_commit_lag_seconds_bucket0.5"] == 2
    assert samples["zeal_collector_commit_lag_seconds_bucket1.0"] == 3
    assert samples["zeal_collector_commit_lag_seconds_bucket+Inf"] == 3
    assert abs(samples["zeal_collector_commit_lag_seconds_sum"] - 0.703) < 1e-6
    assert len(LAG_BUCKETS) + 1 == sum(1 for k in samples if "_bucket" in k)


def test_the_summary_holds_the_most_recent_lags_across_commits_of_any_size() -> None:
    """Commits of 1 to 9,000 messages, 61,000 in all: the summary holds exactly the last
    RECENT_LAGS lags (each a distinct value here, so which ones is visible)."""
    lags = CommitLags()
    rng = np.random.default_rng(5)
    committed = float(int(time.time() * 1000))
    given: list[int] = []
    while len(given) < 3 * RECENT_LAGS + 1000:
        n = int(rng.integers(1, 9000))
        chunk = list(range(len(given), len(given) + n))
        given.extend(chunk)
        lags.observe_many(committed, [int(committed) - v for v in chunk])
    summary = lags.summary()
    assert summary is not None
    recent = sorted(given[-RECENT_LAGS:])
    assert summary["n"] == RECENT_LAGS
    assert summary["max"] == recent[-1]
    assert summary["p50"] == recent[RECENT_LAGS // 2]
    assert summary["p99"] == recent[int(0.99 * RECENT_LAGS)]


def test_the_summary_leaves_out_commits_older_than_its_window() -> None:
    lags = CommitLags()
    now = float(int(time.time() * 1000))
    lags.observe_many(now - 120_000, [int(now) - 121_000] * 5)  # two minutes ago: 1 s lags
    lags.observe_many(now, [int(now) - 20, int(now) - 40])
    assert lags.summary(60) == {"p50": 40.0, "p99": 40.0, "max": 40.0, "n": 2}
    assert lags.summary(300)["n"] == 7  # type: ignore[index]
    assert CommitLags().summary() is None
