"""Helpers the tests share (never imported from a test module)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from zeal import Zeal

STREAM_A = Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=6)


def blocks(kind: str) -> list[dict[str, str]]:
    text = DOC.read_text()
    found = re.findall(rf"```{kind}\n(.*?)```", text, flags=re.S)
    return [dict(line.split(": ", 1) for line in block.strip().splitlines()) for block in found]


def stream_of(spec: str) -> Zeal:
    kwargs = {
        key: float(value) if "." in value else int(value)
        for key, value in (item.split("=") for item in spec.split())
    }
    return Zeal(**kwargs)  # type: ignore[arg-type]


def timestamps_of(spec: str) -> list[int]:
    words = spec.split()
    if words[0] == "periodic":
        base, period, count = map(int, words[1:])
        return [base + i * period for i in range(count)]
    return [int(w) for w in words]


def mutated(payload: bytes, rng: np.random.Generator) -> bytes:
    """The payload with one to three random edits (bit flips, cuts, insertions, bytes)."""
    data = bytearray(payload)
    for _ in range(int(rng.integers(1, 4))):
        op = rng.integers(0, 4)
        pos = int(rng.integers(0, len(data))) if data else 0
        if op == 0 and data:
            data[pos] ^= 1 << int(rng.integers(0, 8))
        elif op == 1 and data:
            del data[pos:]
        elif op == 2:
            data[pos:pos] = rng.bytes(int(rng.integers(1, 4)))
        elif data:
            data[pos] = int(rng.integers(0, 256))
    return bytes(data)


DOC = Path(__file__).resolve().parents[2] / "docs" / "wire-format.md"
