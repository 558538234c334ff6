"""Shared fixtures: the bundled real temperature data, a private Mosquitto broker."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from tests.mqtt_helpers import Mosquitto

DATA = Path(__file__).resolve().parent.parent / "data"


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
