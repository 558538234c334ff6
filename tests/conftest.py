"""Shared fixtures: the bundled real temperature data, a private Mosquitto broker, a fresh
clone of the repository."""

from __future__ import annotations

import csv
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from tools.testbed.broker import Mosquitto

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"


def load_temps(name: str) -> npt.NDArray[np.float64]:
    with (DATA / name).open(newline="") as handle:
        return np.array([float(row["temp"]) for row in csv.DictReader(handle)])


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
