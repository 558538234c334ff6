"""Helpers the tests share (never imported from a test module)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"


def load_temps(name: str) -> npt.NDArray[np.float64]:
    with (DATA / name).open(newline="") as handle:
        return np.array([float(row["temp"]) for row in csv.DictReader(handle)])
