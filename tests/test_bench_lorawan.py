"""`bench/lorawan.py`: the LoRaWAN comparison runs, its airtime formula gives the published
figures, the profile takes at most 0.3 of CayenneLPP's bytes per reading at 10 readings an
uplink up to 6 bits, and bench/REPORT.md shows the tables the script writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def bench_module() -> ModuleType:
    return load_script(ROOT / "bench" / "lorawan.py", "bench_lorawan")


def test_the_airtime_formula_gives_the_published_figures() -> None:
    """Semtech's LoRa calculator (and The Things Network's, which follows it): 10 bytes of
    application payload (23 of PHYPayload) take 61.7 ms at SF7 and 1,482.8 ms at SF12,
    125 kHz, CR 4/5; 51 bytes (64) take 118.0 ms and 2,793.5 ms."""
    bench = bench_module()
    for phy, sf, published in ((23, 7, 61.7), (23, 12, 1482.8), (64, 7, 118.0), (64, 12, 2793.5)):
        assert bench.airtime_ms(phy, sf) == pytest.approx(published, abs=0.05), (phy, sf)


def test_the_comparison_runs_and_meets_the_size_targets(tmp_path: Path) -> None:
    out = tmp_path / "LORAWAN.md"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "lorawan.py"), "--markdown", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    ratios = text.split("## Against CayenneLPP's temperature, bytes per reading")[1]
    row = next(line for line in ratios.splitlines() if line.startswith("| 10 |"))
    by_bits = dict(zip(range(3, 9), map(float, row.strip("| ").split(" | ")[1:]), strict=True))
    assert all(by_bits[bits] <= 0.3 for bits in range(3, 7)), by_bits
    sizes = text.split("## FRMPayload bytes per reading")[1]
    one = next(line for line in sizes.splitlines() if line.startswith("| 1 |"))
    assert one.split(" | ")[1:7] == ["3.00"] * 6  # one reading: 3 bytes at 3 to 8 bits
    # The report embeds what the script writes (make bench runs it before bench/report.py).
    committed = (ROOT / "bench" / "LORAWAN.md").read_text()
    assert committed == text
    report = (ROOT / "bench" / "REPORT.md").read_text()
    body = [f"#{line}" if line.startswith("## ") else line for line in text.splitlines()[1:]]
    assert "\n".join(body) in report
