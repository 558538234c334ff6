"""Shared fixtures: the bundled real temperature data, a private Mosquitto broker, a fresh
clone of the repository."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from tests.helpers import load_temps
from tools.testbed.broker import Mosquitto

ROOT = Path(__file__).resolve().parent.parent
# The suite's devices send many readings a day into streams whose policy is raised
# (tools.testbed.server.stream_body): the agents and servers it starts as subprocesses lift
# the device cap across streams with it. The device cap's own tests
# (tests/server/ingest/test_device_cap*.py, tests/server/api/test_budgets_api.py) unset it
# and run with the default.
os.environ.setdefault("ZEAL_DEVICE_MAX_EPSILON_PER_DAY", "none")
# The agents the suite starts on its private brokers, where nobody else retains anything,
# trust their server's key on first use (--trust-first-use) instead of being handed it. The
# tests of trust itself (tests/server/broker/test_config_trust.py, test_hostile_round4.py),
# the README walkthrough, the demo and the deployment unset it and give the key as a
# device is given it.
os.environ.setdefault("ZEAL_TRUST_FIRST_USE", "yes")


@pytest.fixture(scope="session")
def seattle() -> npt.NDArray[np.float64]:
    """Hourly Seattle temperatures for 2010 (degrees F, 8759 readings)."""
    return load_temps("seattle-temps.csv")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A private Mosquitto on a free port, with persistence, stopped after the test."""
    server = Mosquitto(tmp_path / "broker").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def fresh_clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh `git clone` of this repository (what is committed, nothing else), shared by
    the tests that run the README's walkthrough and `make demo` as a newcomer would: the
    first of them to run creates its environment (`make install`), the other finds it
    made, which saves one installation (about 90 s) per run. Each uses its own data
    directory (zeal-data/, demo-data/)."""
    clone = tmp_path_factory.mktemp("fresh") / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    return clone


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that asks for a real broker (the `broker` fixture) is an integration test:
    `make test-fast` leaves it out with the modules marked so."""
    for item in items:
        if "broker" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)
