"""Reading /metrics with Prometheus's own parser (prometheus_client.parser)."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, tuple[tuple[str, str], ...]]


def assert_metrics_are_prometheus(response: Any) -> None:
    """The exposition parses; every family has HELP and TYPE lines; counters' samples end
    in _total; the commit lag is a histogram; no gauge pretends to be a summary."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    text = response.text
    families = list(text_string_to_metric_families(text))
    assert families, text
    for family in families:
        assert f"# HELP {_exposed(family)} " in text, family.name
        assert f"# TYPE {_exposed(family)} {family.type}\n" in text, family.name
        assert family.documentation, family.name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        assert all("quantile" not in s.labels for s in family.samples), family.name
    types = {f.name: f.type for f in families}
    assert types["zeal_collector_commit_lag_seconds"] == "histogram"
    assert types["zeal_collector_messages"] == "counter"


def _exposed(family: Any) -> str:
    return f"{family.name}_total" if family.type == "counter" else family.name


def metric_samples(text: str) -> dict[Key, float]:
    """Every sample by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
