"""The operator dashboard in a real browser (Debian's Chromium driven by Playwright).

One server (a subprocess, SQLite, a private Mosquitto) is fed by `zeal-edge simulate`; the
figures the page shows are compared with what the API answers for the same window, interval
and group. Screenshots go to ``test-artifacts/dashboard/`` (or $ZEAL_TEST_ARTIFACTS).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tools.testbed.broker import Mosquitto, fleet_command, free_port, wait_for_port
from tools.testbed.server import stream_body
from tools.testbed.wait import wait_until
from zeal import encode_batch
from zeal.mqtt.streamconfig import params_from_config

playwright_api = pytest.importorskip("playwright.sync_api", reason="make test installs playwright")

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
TOKEN = "operator-secret-for-the-browser-test"
DEVICES, RATE, READINGS = 40, 10, 80
UNIT = "degF"
ARTIFACTS = Path(os.environ.get("ZEAL_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "dashboard"


@dataclass
class Server:
    origin: str

    def call(
        self, path: str, *, method: str = "GET", body: Any = None, token: str | None = None
    ) -> Any:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.origin + path, data, headers, method=method)
        for attempt in range(10):
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                # A heavy read while the page runs one: asked again after Retry-After, as
                # docs/server.md ("Heavy reads") tells clients to.
                if exc.code != 429 or attempt == 9:
                    raise
                time.sleep(float(exc.headers.get("Retry-After", "2")))  # the server's word
        raise AssertionError("unreachable")

    def get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v not in (None, "")})
        return self.call(f"{path}?{query}" if query else path)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A fed server: 40 devices x 80 readings, 10 per second, tagged north/south/unset."""
    tmp = tmp_path_factory.mktemp("dashboard")
    broker = Mosquitto(tmp / "broker").start()
    port = free_port()
    env = {
        **os.environ,
        "ZEAL_DATABASE_URL": f"sqlite:///{tmp}/zeal.sqlite",
        "ZEAL_MQTT_URL": broker.url,
        "ZEAL_OPERATOR_TOKEN": TOKEN,
        "ZEAL_COLLECTOR_ID": "dashboard-test",
        # its stream's policy is raised for the fleet (stream_body), and the device cap
        # across streams with it
        "ZEAL_DEVICE_MAX_EPSILON_PER_DAY": "1000000",
    }
    log = (tmp / "server.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "zeal_server", "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, timeout=30)
        srv = Server(f"http://127.0.0.1:{port}")
        wait_until(
            lambda: srv.call("/healthz", token=TOKEN).get("broker") == "ok", 30, "the collector"
        )
        body = stream_body(bucket_seconds=1, unit=UNIT)
        srv.call("/api/v1/streams", method="POST", body=body, token=TOKEN)
        fleet = subprocess.run(
            fleet_command(
                broker.url,
                tmp / "fleet",
                *("--devices", str(DEVICES), "--rate", str(RATE), "--readings", str(READINGS)),
                *("--batch", "10"),
            ),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert fleet.returncode == 0, fleet.stderr[-2000:]
        wait_until(
            lambda: srv.get("/api/v1/streams/temps/stats")["readings"] == DEVICES * READINGS,
            30,
            "every reading stored",
        )
        for d in range(20):
            site = "north" if d < 10 else "south"
            srv.call(
                f"/api/v1/streams/temps/devices/sim-{d:05d}/tags",
                method="PUT",
                body={"tags": {"site": site}},
                token=TOKEN,
            )
        srv.broker = broker  # type: ignore[attr-defined]
        yield srv
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()
        broker.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)")
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any, server: Server, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh page recording every request it makes and every script error."""
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    tab = context.new_page()
    errors: list[str] = []
    requested: list[str] = []
    tab.on("request", lambda r: requested.append(r.url))
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.requested = requested
    yield tab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()
    assert not errors, errors
    foreign = [u for u in requested if not u.startswith(server.origin + "/")]
    assert not foreign, f"requests outside {server.origin}: {foreign[:10]}"


def text(page: Any, selector: str) -> str:
    return str(page.locator(selector).inner_text()).strip()


def wait_for_summary(page: Any, **expected: str) -> dict[str, str]:
    """Wait until the stream page shows figures computed for the expected window/group."""
    conditions = " && ".join(
        f"s.dataset.{key} === {json.dumps(value)}" for key, value in expected.items()
    )
    page.wait_for_function(
        f"() => {{ const s = document.getElementById('summary'); "
        f"return s && s.dataset.mean !== undefined && {conditions or 'true'}; }}",
        timeout=15000,
    )
    data: dict[str, str] = page.eval_on_selector("#summary", "s => ({...s.dataset})")
    return data


def assert_page_matches_api(page: Any, server: Server, summary: dict[str, str]) -> None:
    """The figures and every chart point equal the API's answer for the same query."""
    common = {
        "start": summary["start"] or None,
        "end": summary["end"] or None,
        "group": summary["group"] or None,
    }
    average = server.get("/api/v1/streams/temps/average", **common)
    mean = average["estimate"]["mean"]
    assert float(summary["mean"]) == mean
    assert text(page, "#window-mean") == f"{mean:.3f} {UNIT}"
    assert text(page, "#window-n") == f"{average['n']:,}"
    low, high = average["estimate"]["guaranteed"]
    stream = server.get("/api/v1/streams/temps")
    low, high = max(low, stream["lower"]), min(high, stream["upper"])  # cut to the range
    assert text(page, "#window-guaranteed") == f"{low:.3f} – {high:.3f} {UNIT}"
    assert "cut to the stream's range" in text(page, "#range-note")
    if average["n"] <= 1000:  # few readings: the Bayes estimate beside AVG*, from the API
        bayes = server.get("/api/v1/streams/temps/average", **common, estimator="bayes")["bayes"]
        assert float(summary["bayes"]) == bayes["mean"]
        low, high = bayes["interval"]
        assert text(page, "#window-bayes") == f"{bayes['mean']:.3f} ({low:.3f} – {high:.3f}) {UNIT}"
        assert bayes["prior"] in text(page, "#window-bayes-label")
    else:
        assert summary["bayes"] == ""
    series = server.get(
        "/api/v1/streams/temps/series",
        interval_seconds=summary["interval"],
        estimator="bayes",
        **common,
    )["points"]
    drawn = page.eval_on_selector_all(
        "#chart circle.point", "cs => cs.map(c => [c.dataset.start, Number(c.dataset.mean)])"
    )
    assert drawn, "no points drawn"
    expected = [
        [datetime.fromisoformat(p["start"]), p["estimate"]["mean"]] for p in series if p["estimate"]
    ]
    assert [[datetime.fromisoformat(s), m] for s, m in drawn] == expected
    # The table behind the chart: each point with few readings has its Bayes estimate.
    cells = page.eval_on_selector_all("#points-body td.bayes", "ts => ts.map(t => t.textContent)")
    wanted = []
    for p in series:
        b = p["bayes"]
        shown = f"{b['mean']:.3f} ({b['interval'][0]:.3f} – {b['interval'][1]:.3f}) {UNIT}"
        wanted.append(shown if b and p["n"] <= 1000 else "–")
    assert cells == wanted


def test_overview_shows_the_api_average(page: Any, server: Server) -> None:
    page.goto(server.origin + "/")
    cell = page.locator("tr[data-stream=temps] [data-testid=overview-mean]")
    cell.wait_for(timeout=15000)
    start = cell.get_attribute("data-start")
    average = server.get("/api/v1/streams/temps/average", start=start)
    mean = average["estimate"]["mean"]
    assert average["n"] == DEVICES * READINGS
    assert cell.inner_text().strip() == f"{mean:.3f} {UNIT}"
    assert float(cell.get_attribute("data-mean")) == mean
    row = page.locator("tr[data-stream=temps]").inner_text()
    assert f"{DEVICES * READINGS:,}" in row
    assert "live" in row


def test_stream_page_draws_both_bands_from_the_series(page: Any, server: Server) -> None:
    page.goto(server.origin + "/#/stream/temps?window=all")
    summary = wait_for_summary(page, group="")
    for band in ("band-guaranteed", "band-normal"):
        d = page.get_attribute(f"#chart path.{band}", "d")
        assert d, band
        assert d.startswith("M"), band
        assert d.count("L") >= 3, band
    assert page.eval_on_selector("#chart-unit", "t => t.textContent") == UNIT
    legend = text(page, "#legend")
    assert "guaranteed interval" in legend
    assert "normal-approximation interval" in legend
    assert_page_matches_api(page, server, summary)
    # The guaranteed band is the wider one: it encloses the normal band at every point,
    # strictly but where both are cut at the stream's range (a point of few readings).
    stream = server.get("/api/v1/streams/temps")
    series = server.get("/api/v1/streams/temps/series", interval_seconds=summary["interval"])[
        "points"
    ]
    for p in series:
        g, c = p["estimate"]["guaranteed"], p["estimate"]["ci"]
        assert g[0] <= c[0] < c[1] <= g[1]
        assert g[0] < c[0] or c[0] == stream["lower"]
        assert c[1] < g[1] or c[1] == stream["upper"]


def test_window_interval_and_group_change_the_chart_to_the_api_values(
    page: Any, server: Server
) -> None:
    page.goto(server.origin + "/#/stream/temps?window=all")
    everyone = wait_for_summary(page, group="")
    page.select_option("#group", "site:north")
    north = wait_for_summary(page, group="site:north")
    assert north["mean"] != everyone["mean"]
    assert_page_matches_api(page, server, north)
    page.screenshot(path=str(ARTIFACTS / "group-north.png"), full_page=False)

    page.select_option("#interval", "2")
    two = wait_for_summary(page, group="site:north", interval="2")
    assert_page_matches_api(page, server, two)

    # A custom window over part of the data: the figures follow it.
    stamps = server.get("/api/v1/streams/temps/series", interval_seconds=1)["points"]
    first = datetime.fromisoformat(stamps[0]["start"])
    start = (first + timedelta(seconds=2)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    end = (first + timedelta(seconds=5)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    page.select_option("#window", "custom")
    page.fill("#custom-start", start)
    page.dispatch_event("#custom-start", "change")
    page.fill("#custom-end", end)
    page.dispatch_event("#custom-end", "change")
    custom = wait_for_summary(page, start=f"{start}Z", end=f"{end}Z", group="site:north")
    assert_page_matches_api(page, server, custom)
    assert int(text(page, "#window-n").replace(",", "")) < DEVICES * READINGS // 4
    assert custom["bayes"] != ""  # a window this small shows the Bayes estimate
    # An end on a whole minute: the input's value drops ":00", the window keeps it.
    minute = (first + timedelta(minutes=2)).replace(second=0).astimezone(UTC)
    whole = minute.strftime("%Y-%m-%dT%H:%M:%S")
    assert whole.endswith(":00")
    page.fill("#custom-end", whole)
    page.dispatch_event("#custom-end", "change")
    wait_for_summary(page, start=f"{start}Z", end=f"{whole}Z", group="site:north")

    page.select_option("#window", "all")
    page.select_option("#group", "")
    page.select_option("#group-a", "site:north")
    page.select_option("#group-b", "site:south")
    page.wait_for_function(
        "() => document.getElementById('compare-out').dataset.p !== undefined", timeout=15000
    )
    compare = server.get("/api/v1/streams/temps/compare", a="site:north", b="site:south")
    assert text(page, "#compare-p") == shown_p(compare["p_value"])
    assert text(page, "#compare-diff") == f"{compare['difference']:.3f} {UNIT}"


def shown_p(p_value: float) -> str:
    """The page's p-value format (fmtP in app.js)."""
    shown = f"{p_value:.2e}" if p_value < 1e-4 else f"{p_value:#.3g}"
    return shown.replace("e-0", "e-")


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("cluster", {"unit": "device", "method": "cluster"}),
        ("device_means", {"method": "device_means"}),
        ("trimmed", {"method": "trimmed"}),
        ("censored", {"method": "censored"}),
        ("winsorized", {"method": "winsorized"}),
        ("reading", {"unit": "reading"}),
    ],
)
def test_comparison_panel_shows_the_api_figures_for_each_method(
    page: Any, server: Server, method: str, expected: dict[str, Any]
) -> None:
    """The operator picks the method; the panel shows the API's difference, interval,
    p-value, method, estimand, degrees of freedom, units and warnings."""
    page.goto(server.origin + "/#/stream/temps?window=all&a=site:north&b=site:south")
    page.wait_for_function(
        "() => document.getElementById('compare-out').dataset.method === 'cluster'",
        timeout=15000,
    )
    page.select_option("#compare-method", method)
    answer = server.get("/api/v1/streams/temps/compare", a="site:north", b="site:south", **expected)
    page.wait_for_function(
        "m => document.getElementById('compare-out').dataset.method === m",
        arg=answer["method"],
        timeout=15000,
    )
    assert text(page, "#compare-estimand") == answer["estimand"]
    data = page.eval_on_selector("#compare-out", "o => ({...o.dataset})")
    if answer["difference"] is None:  # censored: offered from 30 devices per group
        assert method == "censored"
        assert data["difference"] == ""
        assert any("at least 30 partitions" in w for w in answer["warnings"])
        shown = page.eval_on_selector_all(
            "#compare-warnings li", "ls => ls.map(l => l.textContent)"
        )
        assert shown == answer["warnings"]
        assert (
            text(page, "#compare-note") == "No inference for this choice: see the warnings below."
        )
        return
    assert float(data["difference"]) == answer["difference"]
    assert float(data["p"]) == answer["p_value"]
    assert text(page, "#compare-diff") == f"{answer['difference']:.3f} {UNIT}"
    low, high = answer["ci"]
    assert text(page, "#compare-ci") == f"{low:.3f} – {high:.3f} {UNIT}"
    assert text(page, "#compare-p") == shown_p(answer["p_value"])
    warnings = page.eval_on_selector_all("#compare-warnings li", "ls => ls.map(l => l.textContent)")
    assert warnings == answer["warnings"]
    if method == "reading":
        assert answer["df"] is None
        assert data["df"] == ""
        assert text(page, "#compare-df") == "∞ (normal)"
        assert text(page, "#compare-units") == f"{answer['n_a']:,} / {answer['n_b']:,} readings"
        return
    assert float(data["df"]) == answer["df"]
    assert text(page, "#compare-df") == f"{answer['df']:.1f}"
    pa, pb = answer["partitions"]
    assert text(page, "#compare-units") == f"{pa:,} / {pb:,} devices"
    if pa < 10:  # few devices: the few-partitions warning shows
        assert any("fewer than 10" in w for w in warnings)
    # The choice is kept in the address, so a reload shows the same comparison.
    assert f"method={method}" in page.url or method == "cluster"


def test_comparison_planner_shows_the_api_plan_and_its_errors(page: Any, server: Server) -> None:
    """The planner in the comparison panel asks GET /preview/compare with the stream's range,
    epsilon and code width and shows the API's standard error, power and detectable
    difference; a bad value gets the API's reason."""
    page.goto(server.origin + "/#/stream/temps?window=all")
    page.wait_for_function("() => document.getElementById('plan-between').value !== ''")
    page.click("#plan-box summary")
    # Tables still filling may shift the page between Playwright's check and its click, which
    # then lands beside the summary (seen on a loaded machine): the state wanted is "open".
    if not page.eval_on_selector("#plan-box", "d => d.open"):
        page.eval_on_selector("#plan-box", "d => { d.open = true; }")
    page.locator("#plan-devices").wait_for(state="visible")
    for selector, value in (
        ("#plan-devices", "15"),
        ("#plan-readings", "40"),
        ("#plan-readings-cv", "0.3"),
        ("#plan-between", "5"),
        ("#plan-within", "12"),
        ("#plan-mean", "30"),
        ("#plan-effect", "6"),
    ):
        page.fill(selector, value)
    page.select_option("#plan-shape", "lognormal")
    page.wait_for_function(
        "() => (document.getElementById('plan-out').dataset.query || '').includes("
        "'shape=lognormal') && document.getElementById('plan-out').dataset.query.includes("
        "'effect=6') && document.getElementById('plan-out').dataset.query.includes('mean=30')",
        timeout=15000,
    )
    data = page.eval_on_selector("#plan-out", "o => ({...o.dataset})")
    stream = server.get("/api/v1/streams/temps")
    expected = {
        "lower": stream["lower"],
        "upper": stream["upper"],
        "epsilon": stream["epsilon"],
        "payload_bits": stream["payload_bits"],
        "devices": 15,
        "readings": 40,
        "readings_cv": 0.3,
        "between_sd": 5,
        "within_sd": 12,
        "mean": 30,
        "shape": "lognormal",
        "effect": 6,
        "alpha": 0.05,
        "power": 0.8,
    }
    plan = server.get("/api/v1/preview/compare", **expected)
    assert plan["power_from"].startswith("simulation")
    assert float(data["stdError"]) == plan["std_error"]
    assert float(data["power"]) == plan["power"]
    assert float(data["detectable"]) == plan["detectable_effect"]
    shown = page.eval_on_selector_all("#plan-out dd", "ds => ds.map(d => d.textContent)")
    assert shown[0] == f"{plan['std_error']:.4f} {UNIT}"
    assert shown[2] == f"{plan['power']:.3f}"
    assert shown[3] == f"{plan['detectable_effect']:.3f} {UNIT}"
    assert shown[5] == plan["power_from"]
    page.fill("#plan-alpha", "2")
    page.wait_for_function(
        "() => document.getElementById('plan-note').textContent.includes('alpha')", timeout=15000
    )
    assert page.eval_on_selector_all("#plan-out dd", "ds => ds.length") == 0


def test_devices_table_sorts_and_pages(page: Any, server: Server) -> None:
    page.goto(server.origin + "/#/stream/temps?window=all")
    wait_for_summary(page)
    page.wait_for_function("() => document.querySelectorAll('#devices-body tr').length === 25")
    assert text(page, "#devices-page") == f"1–25 of {DEVICES}"
    page.click("#devices-next")
    page.wait_for_function(
        f"() => document.getElementById('devices-page').textContent === '26–{DEVICES} of {DEVICES}'"
    )
    assert page.locator("#devices-body tr").first.inner_text().startswith("sim-00025")
    page.click("button[data-sort=name]")  # name, now descending
    page.wait_for_function(
        "() => document.querySelector('#devices-body td').textContent === 'sim-00039'"
    )
    assert page.get_attribute("th:has(button[data-sort=name])", "aria-sort") == "descending"
    efficiency = text(page, "#efficiency")
    assert "JSON message per reading" in efficiency
    stats = server.get("/api/v1/streams/temps/stats")
    assert f"{stats['efficiency']['wire_bits']:.2f}" in text(page, "#eff-wire")
    assert f"{stats['efficiency']['wire_vs_json']:.1f}×" in text(page, "#eff-json")
    assert "all in" in text(page, "#eff-database")
    assert text(page, "#eff-database").endswith(f"{stats['efficiency']['database_bits']:.2f}")
    assert stats["efficiency"]["database_bits"] > stats["efficiency"]["store_bits"]


def test_the_operators_figures_come_first_and_the_mechanism_waits_behind_details(
    page: Any, server: Server
) -> None:
    """Bits per reading lead as savings (the wire against JSON and a float64 value, the disk
    all in); the mechanism's internals (Abar, C, shared bits, the paper's CR and TR) are in
    closed disclosures, on the stream page and in the new-stream preview."""
    page.goto(server.origin + "/#/stream/temps?window=all")
    wait_for_summary(page)
    page.wait_for_function(
        "() => document.getElementById('eff-lead-wire').textContent.includes('bits')",
        timeout=15000,
    )
    e = server.get("/api/v1/streams/temps/stats")["efficiency"]
    wire = text(page, "#eff-lead-wire")
    assert wire.startswith(f"{e['wire_bits']:.1f} bits: {e['wire_vs_json']:.1f}× less than JSON")
    assert f"{e['wire_vs_float64']:.1f}× less than a float64 value alone" in wire
    disk = text(page, "#eff-lead-disk")
    floor = "" if e["database_pages_grown"] else "at least "
    assert disk.startswith(f"{floor}{e['database_bits']:.1f} bits")
    assert e["database_bits"] >= e["store_bits"] > 0  # never less than its segments hold
    # The float64 row is with the wire figures, not beside the all-in store row.
    rows = page.eval_on_selector_all(
        "#efficiency-body tr", "rs => rs.map(r => r.id || r.textContent)"
    )
    assert rows.index("eff-float64") < rows.index("On disk") < rows.index("eff-database")
    shown = text(page, "#stream-params")
    for internal in ("Abar", "Shared bits", "Grid step", "Fingerprint"):
        assert internal not in shown
    assert "Realized ε" in shown
    assert "Privacy policy" in shown
    for box, inside in [("#mechanism-box", "Abar"), ("#efficiency-paper", "CR =")]:
        assert page.eval_on_selector(box, "d => d.open") is False
        assert inside in page.eval_on_selector(box, "d => d.textContent")
    assert "CR =" not in text(page, "#efficiency-note")
    page.click("#mechanism-box summary")
    assert "Abar" in text(page, "#mechanism-params")

    page.goto(server.origin + "/#/new")
    page.fill("#epsilon", "0.5")
    page.wait_for_function(
        "() => document.getElementById('preview-details').textContent.includes('Abar')",
        timeout=10000,
    )
    assert "Abar" not in text(page, "#preview")
    assert "Standard error" in text(page, "#preview")
    assert page.eval_on_selector("#preview-mechanism", "d => d.open") is False


def wait_for_message(page: Any, fragment: str) -> None:
    page.wait_for_function(
        "f => document.getElementById('create-message').textContent.includes(f)", arg=fragment
    )


def test_creating_a_stream_needs_the_operator_token(page: Any, server: Server) -> None:
    page.goto(server.origin + "/#/new")
    page.fill("#name", "from-browser")
    page.fill("#lower", "10")
    page.fill("#upper", "30")
    page.fill("#epsilon", "0.5")
    page.fill("#max_epsilon_per_day", "12")
    page.fill("#reading_every", "600")
    asked = {
        "lower": 10,
        "upper": 30,
        "epsilon": 0.5,
        "n": 10000,
        "max_epsilon_per_day": 12,
        "reading_every_seconds": 600,
    }
    preview = server.get("/api/v1/preview", **asked)
    # Each fill starts a preview 250 ms later; on a slow machine one for the fields filled
    # so far can land first (its payload bits and standard error are already the final
    # ones, its policy rows not), so wait for a row that only the last fields give.
    page.wait_for_function(
        f"() => document.getElementById('preview').dataset.payloadBits === "
        f"'{preview['payload_bits']}' && document.getElementById('preview').innerText"
        f".includes('{preview['std_error']:.4g}') && document.getElementById('preview')"
        f".innerText.includes('{preview['epsilon_per_day']:.2f} (')",
        timeout=10000,
    )
    # The policy's figures: 24 readings a day at 0.5 (2 an hour); 144 a day every 10
    # minutes is over it.
    assert (preview["readings_per_day"], preview["epsilon_per_day"]) == (24, 72.0)
    assert preview["readings_per_hour"] == 2
    shown = page.locator("#preview").inner_text()
    assert "Readings per device per day (policy)\n24\n… and per UTC hour\n2" in shown, shown
    assert "72.00 (over the policy: the excess is skipped)" in shown, shown

    assert "Cap that skips readings\nboth the hour's and the day's" in shown, shown

    # The fleet planner: 500 devices, hourly windows (docs/privacy.md, "Planning a fleet").
    page.fill("#plan_devices", "500")
    page.fill("#plan_interval", "3600")
    planned = server.get("/api/v1/preview", **asked, devices=500, interval_seconds=3600)
    windows, best = planned["windows"], planned["best"]
    page.wait_for_function(
        "() => document.getElementById('preview').textContent.includes('Planner at the best')",
        timeout=10000,
    )
    shown = page.locator("#preview").inner_text()
    assert f"windows no device fills\n{100 * windows['fleet_empty_share']:.1f} %" in shown, shown
    assert f"standard error of a window's average\n{windows['std_error']:.4g}" in shown, shown
    assert f"Planner at the best ε\nε {best['epsilon']:.6f}:" in shown, shown

    # The same device also runs the stream temps: both under its cap across streams.
    page.fill("#plan_with", "temps")
    page.fill("#plan_shares", "3,1")
    together = server.get(
        "/api/v1/preview", **asked, devices=500, interval_seconds=3600, with_streams="temps",
        shares="3,1",
    )["device"]  # fmt: skip
    page.wait_for_function(
        "() => document.getElementById('preview').textContent.includes('… temps')",
        timeout=10000,
    )
    shown = page.locator("#preview").inner_text()
    for s in together["streams"]:
        line = f"… {s['stream']}\nshare ε {s['share_epsilon']:.6f}: {s['readings_per_day']:,} a day"
        assert line in shown, (line, shown)
    assert "Device cap across its streams" in shown, shown

    # The page says what this server requires (GET /server: it has an operator token).
    page.wait_for_function(
        "() => document.getElementById('create-token-note').textContent.includes('Needs')",
        timeout=10000,
    )
    assert server.get("/api/v1/server")["operator_token_required"] is True
    page.click("#create-button")
    message = page.locator("#create-message")
    wait_for_message(page, "Not created")
    assert "operator token required" in message.inner_text()
    assert "ZEAL_OPERATOR_TOKEN" in message.inner_text()

    page.fill("#token", "not-the-token")
    page.click("#token-form button[type=submit]")
    page.click("#create-button")
    wait_for_message(page, "wrong")
    assert "wrong operator token" in message.inner_text()
    with pytest.raises(urllib.error.HTTPError, match="404"):
        server.get("/api/v1/streams/from-browser")

    page.fill("#token", TOKEN)
    page.click("#token-form button[type=submit]")
    page.click("#create-button")
    wait_for_message(page, "created")
    created = server.get("/api/v1/streams/from-browser")
    assert (created["lower"], created["upper"], created["epsilon"]) == (10, 30, 0.5)
    assert created["payload_bits"] == preview["payload_bits"]
    assert (created["max_epsilon_per_day"], created["readings_per_day"]) == (12.0, 24)
    # A bad value gets the server's own explanation.
    page.fill("#name", "bad name with spaces")
    page.click("#create-button")
    wait_for_message(page, "Not created")
    assert "name" in message.inner_text()


def test_the_page_requests_nothing_outside_its_origin(page: Any, server: Server) -> None:
    """Every view, fully loaded, asked its own origin only (the fixture checks every test's
    requests the same way), and the server forbids anything else by its CSP header."""
    views = {
        "/": "[data-testid=overview-mean]",
        "/#/stream/temps?window=all&a=site:north&b=site:south": "#chart circle.point",
        "/#/new": "#preview dt",
    }
    for view, ready in views.items():
        page.goto(server.origin + view)
        page.locator(ready).first.wait_for(timeout=15000)
    page.wait_for_load_state("networkidle")
    requested = page.requested
    assert any(u.endswith("/dashboard/app.js") for u in requested)
    assert any("/api/v1/streams/temps/series" in u for u in requested)
    assert any("/api/v1/preview" in u for u in requested)
    foreign = [u for u in requested if not u.startswith(server.origin + "/")]
    assert not foreign, foreign[:10]
    # The API docs the dashboard links to are served from bundled files too.
    page.goto(server.origin + "/docs")
    page.locator('.opblock-summary-path[data-path="/api/v1/preview"]').wait_for(timeout=15000)
    foreign = [u for u in page.requested if not u.startswith(server.origin + "/")]
    assert not foreign, foreign[:10]
    with urllib.request.urlopen(server.origin + "/", timeout=10) as response:
        policy = response.headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy


def test_every_control_has_a_label_and_the_page_refreshes_itself(page: Any, server: Server) -> None:
    """Accessibility: each input, select and button has an accessible name. And with the
    refresh box ticked the figures are fetched again without any action (every 10 s)."""
    unlabelled_js = """() => [...document.querySelectorAll('input, select, button')]
        .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')
                     && !e.textContent.trim())
        .map(e => e.outerHTML.slice(0, 80))"""
    for view, ready in {
        "/": "[data-testid=overview-mean]",
        "/#/stream/temps?window=all": "#chart circle.point",
        "/#/new": "#preview dt",
    }.items():
        page.goto(server.origin + view)
        page.locator(ready).first.wait_for(timeout=15000)
        assert page.evaluate(unlabelled_js) == [], view
    assert page.locator("svg#chart").count() == 0  # left the stream page
    page.goto(server.origin + "/#/stream/temps?window=all")
    page.locator("#chart circle.point").first.wait_for(timeout=15000)
    assert page.get_attribute("#chart", "role") == "img"
    assert "guaranteed interval" in (page.get_attribute("#chart", "aria-label") or "")
    first = page.eval_on_selector("main", "m => m.dataset.ready")
    page.wait_for_function(
        "before => document.querySelector('main').dataset.ready !== before",
        arg=first,
        timeout=15000,
    )


def test_tags_are_edited_in_the_devices_table_with_the_operator_token(
    page: Any, server: Server
) -> None:
    """Edit, type key:value pairs, save: refused without the operator token (the page says
    why, nothing changes), stored with it, and the new group appears in the filters."""
    page.goto(server.origin + "/#/stream/temps?window=all")
    wait_for_summary(page)
    row = page.locator("#devices-body tr[data-device=sim-00024]")
    row.wait_for(timeout=15000)
    row.get_by_role("button", name="Edit the tags of sim-00024").click()
    row.locator("input").fill("site:east, floor:2")
    row.get_by_role("button", name="Save").click()
    row.locator(".message").filter(has_text="Not saved").wait_for(timeout=10000)
    assert "operator token required" in row.inner_text()
    assert server.get("/api/v1/streams/temps/devices", limit=1000)["devices"][24]["tags"] == {}

    page.fill("#token", TOKEN)
    page.click("#token-form button[type=submit]")
    row.get_by_role("button", name="Save").click()
    page.wait_for_function(
        "() => document.querySelector('#devices-body tr[data-device=sim-00024] td.tags')"
        ".textContent.startsWith('floor:2, site:east')",  # as the server stores them, sorted
        timeout=10000,
    )
    device = server.get("/api/v1/streams/temps/devices", limit=1000)["devices"][24]
    assert (device["name"], device["tags"]) == ("sim-00024", {"floor": "2", "site": "east"})
    page.wait_for_function(
        "() => [...document.querySelectorAll('#group option')].some(o => o.value === 'site:east')"
    )
    server.call(  # as it was, for the other tests
        "/api/v1/streams/temps/devices/sim-00024/tags",
        method="PUT",
        body={"tags": {}},
        token=TOKEN,
    )


def test_stream_page_shows_the_privacy_policy_and_each_devices_spend_today(
    page: Any, server: Server
) -> None:
    """The stream's policy in its parameters, and each device's epsilon spent since first
    seen and on today's readings, as the API gives them."""
    page.goto(server.origin + "/#/stream/temps?window=all")
    wait_for_summary(page)
    stream = server.get("/api/v1/streams/temps")
    policy = page.locator("#stream-params dt", has_text="Privacy policy").locator(
        "xpath=following-sibling::dd[1]"
    )
    cap = f"{stream['max_epsilon_per_day']:,.6f}".rstrip("0").rstrip(".")
    assert policy.inner_text() == (
        f"at most {cap} ε per device per UTC day ({stream['readings_per_day']:,} readings, "
        f"at most {stream['readings_per_hour']:,} in one UTC hour)"
    )
    page.locator("#devices-body tr[data-device=sim-00000]").wait_for(timeout=15000)
    device = next(
        d
        for d in server.get("/api/v1/streams/temps/devices", limit=1000)["devices"]
        if d["name"] == "sim-00000"
    )
    row = page.locator("#devices-body tr[data-device=sim-00000]")
    assert row.locator("td.today").inner_text() == f"{device['epsilon_today']:.2f}"
    # Its account over all its streams (the API's /budgets figures): 30 days shown, the
    # other horizons in the cell's title.
    account = server.get("/api/v1/budgets/devices/sim-00000")
    cell = row.locator("td.account")
    assert cell.inner_text() == f"{account['spent_last_30_days']:.2f}"
    assert f"{account['spent_since_first_seen']:.2f} since first seen" in (
        cell.get_attribute("title") or ""
    )
    assert row.locator("td.flags").inner_text() == (", ".join(device["flags"]) or "–")
    assert device["epsilon_spent"] == device["readings"] * stream["epsilon"]
    # The spread of the devices' accounts over the stream's devices: /stats' figures.
    spread = server.get("/api/v1/streams/temps/stats")["device_accounts"]
    month = page.locator("#account-last_30_days td")
    month.first.wait_for(timeout=15000)
    assert month.all_inner_texts() == [
        "the last 30 days",
        *(f"{spread['last_30_days'][q]:.2f}" for q in ("median", "p90", "max")),
    ]


def test_resets_duplicates_raw_store_and_clipped_bands_read_right(
    page: Any, server: Server
) -> None:
    """A stream with three readings: one batch of a device, another batch with the same
    sequence number and other content (a reset outbox), and a batch published twice (a
    duplicate), and a garbage message from evil-1. The rejects table shows them with the
    API's counts, and who sent the rejected one, though it never stored; nothing is compacted
    yet, so the store rows say so and claim no saving; and the bands of so few readings,
    far wider than the stream's range, are served cut to it: the axis covers the averages
    (not cut) and the bands."""
    body = stream_body("few", bucket_seconds=3600)
    server.call("/api/v1/streams", method="POST", body={**body, "unit": "kWh"}, token=TOKEN)
    params = params_from_config(server.call("/api/v1/streams/few/config"))
    now = int(time.time() * 1000)
    publish(
        server,
        [
            ("meter-1", encode(params, "meter-1", 0, now, seed=1)),
            ("meter-1", encode(params, "meter-1", 0, now + 1000, seed=2)),  # the reset
            ("dup-1", encode(params, "dup-1", 0, now, seed=3)),
            ("dup-1", encode(params, "dup-1", 0, now, seed=3)),  # the very same bytes again
            ("evil-1", b"\x00garbage"),  # rejected: nothing stored, its name shown
        ],
    )
    wait_until(
        lambda: server.get("/api/v1/streams/few/stats")["duplicates"] == 1, 20, "the duplicate"
    )
    wait_until(
        lambda: server.get("/api/v1/streams/few/rejects")["senders"], 20, "the rejected sender"
    )
    stats = server.get("/api/v1/streams/few/stats")
    assert (stats["readings"], stats["sequence_resets"], stats["duplicates"]) == (3, 1, 1)

    page.goto(server.origin + "/#/stream/few?window=all")
    wait_for_summary(page)
    page.wait_for_function(
        "() => document.getElementById('row-sequence-resets') !== null", timeout=15000
    )
    assert text(page, "#row-sequence-resets").split()[-1] == "1"
    sender = server.get("/api/v1/streams/few/rejects")["senders"][0]
    shown = text(page, "#senders-body")
    assert shown.startswith("evil-1 (never stored a reading)"), shown
    assert f"{next(iter(sender['reasons']))} 1" in shown, shown
    assert text(page, "#row-duplicates").split()[-1] == "1"
    assert "nothing lost" in text(page, "#row-sequence-resets")
    assert stats["efficiency"]["compacted"] == 0
    assert "raw, not yet compacted" in text(page, "#eff-store")
    assert text(page, "#eff-paper-store").endswith(f"{stats['efficiency']['paper_store_bits']:.2f}")
    assert "No bucket is compacted yet" in text(page, "#efficiency-note")
    assert text(page, "#window-mean").endswith(" kWh")

    interval = int(page.eval_on_selector("#summary", "s => s.dataset.interval"))
    points = server.get("/api/v1/streams/few/series", interval_seconds=interval)["points"]
    means = [p["estimate"]["mean"] for p in points]
    low = min(min(p["estimate"]["ci"][0], p["estimate"]["guaranteed"][0]) for p in points)
    high = max(max(p["estimate"]["ci"][1], p["estimate"]["guaranteed"][1]) for p in points)
    assert low >= 0  # the intervals are served cut to the range
    assert high <= 110
    lo, hi = min(*means, max(low, -0.25 * 110)), max(*means, min(high, 1.25 * 110))
    pad = 0.04 * (hi - lo)
    axis = page.eval_on_selector("#chart", "c => [Number(c.dataset.lo), Number(c.dataset.hi)]")
    assert axis == pytest.approx([lo - pad, hi + pad], rel=1e-9)
    assert page.locator("#chart g[clip-path='url(#plot-clip)'] path.band-normal").count() == 1


def encode(params: Any, device: str, sequence: int, stamp: int, *, seed: int) -> bytes:
    """One reading of 50 as a batch, perturbed with a fixed seed."""
    codes = params.perturb(np.array([50.0]), rng=np.random.default_rng(seed))
    return encode_batch(
        params, stream="few", device=device, sequence=sequence, timestamps=[stamp], codes=codes
    )


def publish(server: Server, batches: list[tuple[str, bytes]]) -> None:
    broker: Mosquitto = server.broker  # type: ignore[attr-defined]
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    for device, payload in batches:
        client.publish(f"zeal/v1/few/{device}/up", payload, qos=1).wait_for_publish(10)
    client.disconnect()
    client.loop_stop()


def test_distribution_card_and_quantile_line_show_the_api_figures(
    page: Any, server: Server
) -> None:
    """The histogram's bars, the quantile marks and their figures, and the share above a
    threshold are /distribution's for the page's window; a quantile line on the chart is
    /series?quantile='s, point by point."""
    page.goto(server.origin + "/#/stream/temps?window=all&above=60&quantiles=0.25,0.5,0.9")
    page.wait_for_function(
        "() => document.getElementById('dist-box').dataset.asked !== undefined", timeout=30000
    )
    asked = json.loads(page.get_attribute("#dist-box", "data-asked"))
    body = server.get("/api/v1/streams/temps/distribution", **asked)
    assert body["n"] == DEVICES * READINGS
    shares = page.eval_on_selector_all(
        "#histogram rect.bar", "rs => rs.map(r => Number(r.dataset.share))"
    )
    assert shares == body["probabilities"]
    marks = page.eval_on_selector_all(
        "#histogram line.quantile-mark",
        "ls => ls.map(l => [Number(l.dataset.q), Number(l.dataset.value)])",
    )
    assert marks == [[q["q"], q["value"]] for q in body["quantiles"]]
    figures = page.eval_on_selector_all("#dist-figures .quantile", "fs => fs.map(f => f.innerText)")
    for shown, q in zip(figures, body["quantiles"], strict=True):
        assert f"{q['value']:.3f} ({q['low']:.3f} – {q['high']:.3f}) {UNIT}" in shown
    share = body["above"]
    assert float(page.get_attribute("#dist-above-out", "data-share")) == share["share"]
    assert f"{100 * share['share']:.1f} %" in text(page, "#dist-above-out")
    assert page.locator("#histogram line.threshold").count() == 1
    note = text(page, "#dist-note")
    assert ". Estimated: " in note, note  # two sentences, not run together
    assert note.endswith(".")

    # Close quantiles: their labels do not print over each other.
    page.goto(server.origin + "/#/stream/temps?window=all&quantiles=0.5,0.9,0.95,0.99")
    page.wait_for_function(
        "() => document.querySelectorAll('#histogram text.quantile-label').length === 4",
        timeout=30000,
    )
    boxes = page.eval_on_selector_all(
        "#histogram text.quantile-label",
        "ts => ts.map(t => { const b = t.getBBox(); "
        "return [b.x, b.y, b.x + b.width, b.y + b.height]; })",
    )
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            apart = a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
            assert apart, (a, b)

    page.goto(server.origin + "/#/stream/temps?window=all&above=60&quantiles=0.25,0.5,0.9")
    page.select_option("#quantile-line", "0.9")
    page.wait_for_selector("#chart circle.quantile-point", timeout=30000)
    summary = wait_for_summary(page, group="")
    interval = page.get_attribute("#chart", "data-quantile-interval")
    series = server.get(
        "/api/v1/streams/temps/series",
        start=summary["start"] or None,
        end=summary["end"] or None,
        interval_seconds=interval,
        quantile=0.9,
    )["points"]
    drawn = page.eval_on_selector_all(
        "#chart circle.quantile-point",
        "cs => cs.map(c => [c.dataset.start, Number(c.dataset.value)])",
    )
    expected = [[p["start"], p["quantile"]["value"]] for p in series if p["quantile"]]
    assert [[datetime.fromisoformat(s), v] for s, v in drawn] == [
        [datetime.fromisoformat(s), v] for s, v in expected
    ]
    assert not page.locator("#legend-quantile").is_hidden()
