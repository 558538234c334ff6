"""docs/store-format.md's test vectors, both ways: encoding the readings gives the hex (but
where the block says `direction: decode`), and decoding the hex gives the readings."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from zeal_server.store import segments

DOC = Path(__file__).resolve().parents[3] / "docs" / "store-format.md"
ENCODINGS = {"part": segments.PART, "chunk": segments.CHUNK}


def vectors() -> list[dict[str, str]]:
    blocks = re.findall(r"```segment\n(.*?)```", DOC.read_text(), flags=re.S)
    return [dict(line.split(": ", 1) for line in b.strip().splitlines()) for b in blocks]


def numbers(text: str) -> list[int]:
    return [int(v) for v in text.split()]


def test_the_document_has_vectors_of_every_encoding_written_and_of_compressed_sections() -> None:
    found = vectors()
    assert {v["encoding"] for v in found} == set(ENCODINGS)
    assert any(v.get("direction") == "decode" for v in found)
    for vector in found:
        data = bytes.fromhex(vector["hex"])
        flags = []
        at = 0
        while at < len(data):
            flags.append(data[at])
            at += 5 + int.from_bytes(data[at + 1 : at + 5], "little")
        assert at == len(data), vector["name"]
        compressed = any(flag & 1 for flag in flags)
        assert compressed == (vector.get("direction") == "decode"), vector["name"]


@pytest.mark.parametrize("vector", vectors(), ids=lambda v: v["name"])
def test_store_format_vector(vector: dict[str, str]) -> None:
    bits = int(vector["payload_bits"])
    encoding = ENCODINGS[vector["encoding"]]
    columns = segments.Columns(
        np.array(numbers(vector["codes"]), dtype=np.uint64),
        np.array(numbers(vector["timestamps"]), dtype=np.int64),
        np.array(numbers(vector["devices"]), dtype=np.int64),
    )
    data = bytes.fromhex(vector["hex"])
    if vector.get("direction", "both") == "both":
        encode = segments.encode_part if encoding == segments.PART else segments.encode_chunk
        assert encode(columns, bits).hex() == vector["hex"]
    decoded = segments.decode(data, encoding, bits)
    assert decoded.codes.tolist() == columns.codes.tolist()
    assert decoded.timestamps.tolist() == columns.timestamps.tolist()
    assert decoded.devices.tolist() == columns.devices.tolist()
