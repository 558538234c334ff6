"""`bench/report.py --quick`: the CI smoke test of the benchmark report, and its checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def report_module() -> ModuleType:
    return load_script(ROOT / "bench" / "report.py", "bench_report")


def test_quick_report_runs_and_passes_its_tolerances(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "report.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "every estimate within its variance-derived tolerance" in done.stdout
    report = (tmp_path / "REPORT.md").read_text()
    for heading in (
        "## What the run shows",
        "## Headline",
        "## Closed forms",
        "## Transmission",
        "## Storage",
        "## Speed",
        "## Group comparisons on simulated fleets (paper 003)",
        "## Bayes estimates for small windows (paper 004)",
        "## The readings' distribution: quantiles and histograms from the codes",
    ):
        assert heading in report
    assert (tmp_path / "cr-tr.png").stat().st_size > 10_000
    assert (tmp_path / "utility-seattle.png").stat().st_size > 10_000
    assert "Duchi one bit" in report


def test_the_tolerance_check_catches_a_wrong_prediction() -> None:
    """A biased mechanism predicted as unbiased, and a closed form 10 % off, are flagged."""
    report = report_module()
    rows = report.utility_task(("Seattle", 1.0, ("truncated",), (1000, 10_000), 20, 1))
    assert report.check_tolerances(rows) == []
    wrong = [dict(r) for r in rows]
    for r in wrong:
        r["pred_bias"] = 0.0  # truncation's bias (about 3 F here) ignored
    assert any("mean error" in p for p in report.check_tolerances(wrong))
    off = [dict(r) for r in rows]
    off[-1]["mse_formula"] *= 1.1
    assert any("closed form" in p for p in report.check_tolerances(off))
