"""The monitoring bundle (deploy/prometheus, deploy/grafana) against the real tools: promtool
checks the config, a real Prometheus scrapes a real server with the read token, and every
query of the Grafana dashboard is evaluated by that Prometheus on the server's metrics."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tools.testbed.broker import Mosquitto, free_port, make_certs, wait_for_port
from tools.testbed.server import READ, TOKEN, Server, batches, client, stream_body, wait_until
from zeal.mqtt.streamconfig import params_from_config

pytestmark = pytest.mark.integration  # real brokers, servers or outside tools

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "zeal.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yml"


def alerts() -> dict[str, str]:
    """Every shipped alert: its name and expression."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"]}


def queries() -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and template variables."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    found += [v["definition"] for v in dashboard["templating"]["list"]]
    return found


def test_the_dashboard_uses_the_provisioned_data_source() -> None:
    """Every panel and target names the data source Grafana is provisioned with, and the
    dashboard provider reads the folder the compose file mounts the dashboards in."""
    source = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"][0]
    dashboard = json.loads(DASHBOARD.read_text())
    uids = {p["datasource"]["uid"] for p in dashboard["panels"]}
    uids |= {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]}
    assert uids == {source["uid"]}
    assert source["url"] == "http://prometheus:9090"
    provider = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/zeal.yml").read_text()
    )["providers"][0]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert (
        f"./deploy/grafana/dashboards:{provider['options']['path']}:ro"
        in (compose["services"]["grafana"]["volumes"])
    )
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in ("Ingest rate", "Rejects by reason", "Commit lag", "Readings per stream"):
        assert wanted in titles
    assert any(t.startswith("Average of the last hour") for t in titles)


def test_promtool_accepts_the_prometheus_config(tmp_path: Path) -> None:
    """promtool check config passes on deploy/prometheus/prometheus.yml, with the token file
    where the container writes it (here: a temporary path)."""
    token = tmp_path / "read_token"
    token.write_text(READ)
    make_certs(tmp_path / "tls")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        PROMETHEUS.read_text()
        .replace("/prometheus/read_token", str(token))
        .replace("/etc/prometheus/ca.crt", str(tmp_path / "tls" / "ca.crt"))
    )
    (tmp_path / "alerts.yml").write_text(ALERTS.read_text())
    checked = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 4 rules found" in checked.stdout


def test_every_alert_fires_in_its_promtool_test_and_stays_quiet_when_healthy() -> None:
    """`promtool test rules` passes, and the test file has, for every shipped alert, a time
    when it fires and one when it does not."""
    tested = subprocess.run(
        ["promtool", "test", "rules", ALERT_TESTS.name],
        cwd=ALERT_TESTS.parent,
        capture_output=True,
        text=True,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    cases = [
        c for t in yaml.safe_load(ALERT_TESTS.read_text())["tests"] for c in t["alert_rule_test"]
    ]
    assert set(alerts()) == {
        "ZealCollectorDown",
        "ZealCommitLag",
        "ZealRejectsRising",
        "ZealDeviceSilent",
    }
    for name in alerts():
        outcomes = {bool(c["exp_alerts"]) for c in cases if c["alertname"] == name}
        assert outcomes == {True, False}, name


def _query(prometheus: httpx.Client, expr: str) -> list[dict[str, Any]]:
    answer = prometheus.get("/api/v1/query", params={"query": expr})
    body = answer.json()
    assert body["status"] == "success", (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.mark.integration
def test_prometheus_scrapes_the_server_and_every_dashboard_query_evaluates(
    tmp_path: Path, broker: Mosquitto
) -> None:
    """A server with a read token and a little data, over HTTPS (deploy/tls/make-certs);
    Prometheus with the deployment's scrape config (target, CA and token file pointed here,
    1 s interval): the target is up,
    every metric a dashboard query names is one the server exports, and every query
    evaluates without error to at least one series."""
    server = Server(f"sqlite:///{tmp_path / 'zeal.sqlite'}", broker, tmp_path / "server.log")
    server.env.update({"ZEAL_OPERATOR_TOKEN": TOKEN, "ZEAL_READ_TOKEN": READ})
    make_certs(tmp_path / "tls")
    server.use_https(tmp_path / "tls").start()
    prometheus_process = None
    stack = contextlib.ExitStack()
    reader = {"Authorization": f"Bearer {READ}"}
    try:
        body = stream_body(bucket_seconds=1)
        operator = {"Authorization": f"Bearer {TOKEN}"}
        assert server.http.post("/api/v1/streams", json=body, headers=operator).status_code == 201
        config = server.http.get("/api/v1/streams/temps/config", headers=reader).text
        params = params_from_config(config, stream="temps")
        device = client(broker.port, None)
        for payload in batches(params, "temps", "dev1", 5):
            device.publish("zeal/v1/temps/dev1/up", payload, qos=1).wait_for_publish(5)
        device.publish("zeal/v1/temps/dev1/up", b"garbage", qos=1).wait_for_publish(5)
        device.disconnect()
        device.loop_stop()

        def stored() -> bool:
            stats = server.http.get("/api/v1/streams/temps/stats?efficiency=false", headers=reader)
            answer = stats.json()
            return bool(answer["readings"] == 50 and sum(answer["rejects"].values()) == 1)

        wait_until(stored, 10, "the batches stored and the garbage rejected")
        exported = server.http.get("/metrics", headers=reader).text
        families = list(text_string_to_metric_families(exported))
        names = {s.name for f in families for s in f.samples}
        assert "zeal_collector_rejected_messages_total" in names

        token = tmp_path / "read_token"
        token.write_text(READ)
        scrape = yaml.safe_load(PROMETHEUS.read_text())
        scrape["global"]["scrape_interval"] = "1s"
        (tmp_path / "alerts.yml").write_text(ALERTS.read_text())
        job = scrape["scrape_configs"][0]
        job["authorization"]["credentials_file"] = str(token)
        job["tls_config"]["ca_file"] = str(tmp_path / "tls" / "ca.crt")
        job["static_configs"][0]["targets"] = [f"127.0.0.1:{server.port}"]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(scrape))
        port = free_port()
        prometheus_log = stack.enter_context((tmp_path / "prometheus.log").open("wb"))
        prometheus = stack.enter_context(
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        )
        prometheus_process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=prometheus_log,
        )
        wait_for_port(port, timeout=20)

        def scraped_twice() -> bool:
            try:
                up = _query(prometheus, 'count_over_time(up{job="zeal"}[1m])')
            except (httpx.TransportError, ValueError):
                return False
            return bool(up) and float(up[0]["value"][1]) >= 3

        wait_until(scraped_twice, 30, "three scrapes")
        assert [r["value"][1] for r in _query(prometheus, 'up{job="zeal"}')] == ["1"]
        rules = prometheus.get("/api/v1/rules").json()["data"]["groups"]
        assert {r["name"] for g in rules for r in g["rules"]} == set(alerts())
        assert all(r["health"] != "err" for g in rules for r in g["rules"]), rules
        for expr in alerts().values():
            for name in re.findall(r"\bzeal_[a-z_]+", expr):
                base = re.sub(r"_bucket$", "", name)
                assert name in names or f"{base}_count" in names, (name, expr)
        for expr in queries():
            for name in re.findall(r"\bzeal_[a-z_]+", expr):
                assert name in names, (name, expr)
            if expr.startswith("label_values("):
                values = prometheus.get(
                    "/api/v1/label/stream/values", params={"match[]": "zeal_stream_readings_total"}
                ).json()["data"]
                assert values == ["temps"]
                continue
            result = _query(prometheus, expr.replace("$stream", "temps"))
            assert result, f"no series for {expr}"
    finally:
        if prometheus_process is not None:
            prometheus_process.terminate()
            prometheus_process.wait(timeout=10)
        server.stop()
        stack.close()
