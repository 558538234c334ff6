"""decode_many equals decode_batch payload for payload: the same batches, the same errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.shared.helpers import STREAM_A, blocks, mutated
from zeal import CodecParams, WireError, decode_batch, encode_batch
from zeal.wire import wire_fingerprint
from zeal.wirebatches import decode_many


def assert_same(
    params: CodecParams, payloads: list[bytes], devices: list[str], stream: str = "s"
) -> int:
    """decode_many's answer for each payload is decode_batch's; how many decoded."""
    batches, errors = decode_many(payloads, params, stream=stream, devices=devices)
    assert set(batches.index.tolist()).isdisjoint(errors)
    assert len(batches) + len(errors) == len(payloads)
    assert batches.index.tolist() == sorted(batches.index.tolist())
    for k, i in enumerate(batches.index.tolist()):
        fingerprint = wire_fingerprint(params, stream, devices[i])
        assert batches.batch(k, fingerprint) == decode_batch(
            payloads[i], params, stream=stream, device=devices[i]
        )
    for i, error in errors.items():
        with pytest.raises(WireError) as info:
            decode_batch(payloads[i], params, stream=stream, device=devices[i])
        assert (info.value.reason, str(info.value)) == (error.reason, str(error))
    return len(batches)


def fleet(bits: int, seed: int, size: int) -> tuple[CodecParams, list[bytes], list[str]]:
    """`size` payloads of one stream from several devices: valid, mutated, and of other
    devices."""
    rng = np.random.default_rng(seed)
    params = CodecParams(rng.bytes(4), bits)
    payloads, devices = [], []
    for _ in range(size):
        count = [1, 1, 2, 5, 60, 700][int(rng.integers(0, 6))]
        base = int(rng.integers(0, 2**48 - 2**40))
        if rng.random() < 0.5:
            stamps = base + int(rng.integers(0, 2**20)) * np.arange(count)
        else:
            stamps = base + np.concatenate([[0], np.cumsum(rng.integers(0, 2**30, count - 1))])
        codes = rng.integers(0, 1 << min(bits, 63), count, dtype=np.uint64)
        device = f"d{rng.integers(0, 5)}"
        sequences = [0, 1, 127, 128, 2**63, 2**64 - 1, int(rng.integers(0, 2**62))]
        sequence = sequences[int(rng.integers(0, len(sequences)))]
        payload = encode_batch(
            params, stream="s", device=device, sequence=sequence, timestamps=stamps, codes=codes
        )
        roll = rng.random()
        if roll < 0.3:
            payload = mutated(payload, rng)
        elif roll < 0.35:
            device = f"d{rng.integers(5, 7)}"  # another device's topic: fingerprint_mismatch
        elif roll < 0.4:
            payload = rng.bytes(int(rng.integers(0, 30)))
        payloads.append(payload)
        devices.append(device)
    return params, payloads, devices


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from([1, 3, 5, 6, 8, 9, 16, 23, 28, 32, 33, 64]),
    st.integers(0, 2**32),
    st.integers(1, 40),
)
def test_many_payloads_decode_as_each_alone(bits: int, seed: int, size: int) -> None:
    """Widths 1..64, periodic and irregular, valid, mutated and foreign payloads mixed."""
    assert_same(*fleet(bits, seed, size))


def test_mutated_documented_vectors_decode_as_each_alone() -> None:
    """20,000 mutations of the documented vectors, in transactions of 100: decode_many
    agrees with decode_batch on every one (and thousands still decode)."""
    rng = np.random.default_rng(20261202)
    seeds = [bytes.fromhex(v["hex"]) for v in blocks("vector")]
    decoded = 0
    for _ in range(200):
        payloads = [mutated(seeds[int(rng.integers(0, len(seeds)))], rng) for _ in range(100)]
        payloads[::7] = [seeds[int(rng.integers(0, len(seeds)))] for _ in payloads[::7]]
        decoded += assert_same(STREAM_A, payloads, ["dev1"] * 100, "temps")  # type: ignore[arg-type]
    assert decoded > 3000


def test_anything_but_bytes_is_decoded_alone() -> None:
    """A payload that is not bytes takes decode_batch's path (and its refusal)."""
    payload = bytes.fromhex(blocks("vector")[0]["hex"])
    batches, errors = decode_many(
        [payload, bytearray(payload), "text"],  # type: ignore[list-item]
        STREAM_A,
        stream="temps",
        devices=["dev1"] * 3,
    )
    assert batches.index.tolist() == [0, 1]
    assert list(errors) == [2]
    assert errors[2].reason == "empty"
