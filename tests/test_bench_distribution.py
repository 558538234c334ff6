"""bench/distribution.py: its own Square Wave is the paper's (output density and range), a
short run writes its tables, and bench/REPORT.md shows what the full run wrote."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def test_square_wave_outputs_follow_the_papers_density() -> None:
    """Li et al.'s Square Wave: outputs in [-b, 1 + b], within b of the reading with
    probability 2 b p, p = e^eps / (2 b e^eps + 1); the matrix's columns sum to 1."""
    bench = load_script(ROOT / "bench" / "distribution.py", "bench_distribution")
    eps = 1.0
    b = bench.sw_b(eps)
    x = np.full(200_000, 0.3)
    out = bench.sw_perturb(x, eps, np.random.default_rng(1))
    assert -b <= out.min() < out.max() <= 1 + b
    near = float(np.mean(np.abs(out - 0.3) <= b))
    p = math.exp(eps) / (2 * b * math.exp(eps) + 1)
    assert abs(near - 2 * b * p) < 4 * math.sqrt(near * (1 - near) / x.size)
    assert np.allclose(bench.sw_matrix(eps).sum(axis=0), 1.0)


def test_a_short_run_writes_its_tables(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "distribution.py"),
            *("--only", "beta(5,2)", "--reps", "2", "--coverage", "0"),
            *("--out", str(tmp_path / "d.json"), "--markdown", str(tmp_path / "D.md")),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = (tmp_path / "D.md").read_text()
    assert table.count("| beta(5,2) |") == 12  # 4 epsilons x 3 sizes
    report = (ROOT / "bench" / "REPORT.md").read_text()
    assert "## The readings' distribution: quantiles and histograms from the codes" in report
    assert "| beta(5,2) | 1 | 10,000 |" in report
