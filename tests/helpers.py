"""Helpers the tests share (never imported from a test module)."""

from __future__ import annotations

import csv
import functools
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from zeal.signed import CONFIG_PURPOSE
from zeal_server.store.signing import Signer

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"


def load_temps(name: str) -> npt.NDArray[np.float64]:
    with (DATA / name).open(newline="") as handle:
        return np.array([float(row["temp"]) for row in csv.DictReader(handle)])


def signed(document: dict[str, Any]) -> dict[str, Any]:
    """`document` signed as a server signs configurations (zeal.signed), with a key made for
    this test process: for tests that stand in for the server on a broker. An agent adopts
    it (trust on first use) and pins that key."""
    return _signer().sign(document, CONFIG_PURPOSE)


@functools.cache
def _signer() -> Signer:
    return Signer(secrets.token_bytes(32))
