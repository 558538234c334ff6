"""The date-dependent tests across midnight UTC.

A fresh-clone CI run started a few minutes before 00:00 UTC once failed the policy tests,
which computed "yesterday" when their module was imported. Here they run with the wall clock
of every Python process they start (pytest, the server, the agents) shifted to just before
midnight (tools/testbed/clockshift): a shift, so the clock runs on and midnight falls while
they run, the same for all of them. It starts far enough before midnight that the first
tests start on one day, and close enough that the run ends on the next (both asserted).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
CLOCKSHIFT = ROOT / "tools" / "testbed" / "clockshift"
#: The tests whose answers depend on the UTC day (the privacy policy counts readings per day).
DATE_DEPENDENT = ["tests/server/ingest/test_policy.py", "tests/shared/test_policy.py"]
#: Seconds before midnight UTC the shifted clock starts: less than the policy tests take
#: (about 35 s on two cores), so that they cross it.
BEFORE_MIDNIGHT = 20


def _shifted(shift: float) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(CLOCKSHIFT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "ZEAL_TEST_CLOCK_SHIFT": repr(shift)}


def _clock_now(shift: float) -> float:
    """What time a Python process started with that shift reads."""
    probe = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env=_shifted(shift),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return float(probe.stdout)


def test_the_policy_tests_pass_while_midnight_utc_passes() -> None:
    now = time.time()
    midnight = (now // 86_400 + 1) * 86_400
    # Relative to the real clock, whether or not this run is shifted already.
    shift = float(os.environ.get("ZEAL_TEST_CLOCK_SHIFT") or 0) + midnight - BEFORE_MIDNIGHT - now
    started = _clock_now(shift)
    assert midnight - BEFORE_MIDNIGHT <= started < midnight  # the tests start before it
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DATE_DEPENDENT],
        cwd=ROOT,
        env=_shifted(shift),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
    assert "failed" not in result.stdout
    assert _clock_now(shift) >= midnight  # and they ended on the next day
