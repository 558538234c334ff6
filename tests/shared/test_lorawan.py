"""The LoRaWAN wire profile: documented vectors, sizes, round trips, refusals, and the rate
at which a foreign payload's 12-bit tag passes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.shared.helpers import STREAM_A, blocks, mutated, stream_of
from zeal import CodecParams, WireError
from zeal.lorawan import TAG_BITS, decode_lorawan, encode_lorawan, lorawan_size
from zeal.wire import REASONS, wire_fingerprint

RECEIVED = 1767225600000


def test_documented_vectors_encode_and_decode() -> None:
    """Each LoRaWAN vector in docs/wire-format.md encodes to its hex and decodes to its
    codes, its frame counter as the sequence, and stamps that end at the reception time."""
    vectors = blocks("lorawan")
    assert len(vectors) >= 4
    for v in vectors:
        params = stream_of(v["params"])
        codes = [int(c) for c in v["codes"].split()]
        spacing, received = int(v["spacing"]), int(v["received_ms"])
        payload = encode_lorawan(
            params, stream="temps", device=v["device"], codes=codes, spacing_seconds=spacing
        )
        assert payload.hex() == v["hex"], v["name"]
        batch = decode_lorawan(
            payload,
            params,
            stream="temps",
            device=v["device"],
            frame_counter=int(v["frame_counter"]),
            received_ms=received,
        )
        assert batch.codes.tolist() == codes
        assert batch.sequence == int(v["frame_counter"])
        assert batch.timestamps.tolist() == [
            received - (len(codes) - 1 - i) * spacing * 1000 for i in range(len(codes))
        ]
        assert batch.fingerprint == wire_fingerprint(params, "temps", v["device"])
        for where in ({"stream": "temps", "device": "dev2"}, {"stream": "t2", "device": "dev1"}):
            with pytest.raises(WireError, match="fingerprint_mismatch"):
                decode_lorawan(payload, params, **where, frame_counter=0, received_ms=received)


def test_documented_invalid_payloads_give_their_reason() -> None:
    invalid = blocks("lorawan-invalid")
    assert len(invalid) >= 8
    for v in invalid:
        with pytest.raises(WireError) as info:
            decode_lorawan(
                bytes.fromhex(v["hex"]),
                STREAM_A,
                stream="temps",
                device="dev1",
                frame_counter=1,
                received_ms=int(v.get("received_ms", RECEIVED)),
            )
        assert info.value.reason == v["reason"], v


def test_the_sizes_the_issue_asks_for() -> None:
    """One reading fits 11 bytes with room to spare (3 bytes at up to 8 bits); 10 readings
    at 6 bits take at most 12 bytes for any spacing below 16,384 s (4.5 hours)."""
    for bits in range(1, 9):
        one = encode_lorawan(CodecParams(bytes(8), bits), stream="s", device="d", codes=[0])
        assert len(one) == lorawan_size(bits, 1) == 3
    for spacing in (1, 60, 127, 128, 600, 3600, 16383):
        ten = encode_lorawan(
            CodecParams(bytes(8), 6),
            stream="s",
            device="d",
            codes=[1] * 10,
            spacing_seconds=spacing,
        )
        assert len(ten) == lorawan_size(6, 10, spacing) <= 12
    assert lorawan_size(6, 10, 16384) == 13


@settings(max_examples=300, deadline=None)
@given(
    bits=st.integers(1, 64),
    count=st.integers(1, 300),
    spacing=st.integers(0, (1 << 32) - 1),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_trip(bits: int, count: int, spacing: int, seed: int) -> None:
    params = CodecParams(fingerprint=seed.to_bytes(8, "big"), payload_bits=bits)
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 1 << min(bits, 63), count, dtype=np.uint64)
    if lorawan_size(bits, count, spacing) > 242:
        with pytest.raises(WireError, match="too_large"):
            encode_lorawan(params, stream="s", device="d", codes=codes, spacing_seconds=spacing)
        return
    payload = encode_lorawan(params, stream="s", device="d", codes=codes, spacing_seconds=spacing)
    assert len(payload) == lorawan_size(bits, count, spacing)
    span = (count - 1) * spacing * 1000  # from the first reading to the last, in ms
    if span >= 1 << 48:  # the first reading would be before the epoch
        with pytest.raises(WireError, match="bad_timestamp"):
            decode_lorawan(
                payload, params, stream="s", device="d", frame_counter=9, received_ms=(1 << 48) - 1
            )
        return
    received = span + int(rng.integers(0, (1 << 48) - span))
    batch = decode_lorawan(
        payload, params, stream="s", device="d", frame_counter=9, received_ms=received
    )
    assert batch.codes.tolist() == codes.tolist()
    assert int(batch.timestamps[-1]) == received
    assert np.all(np.diff(batch.timestamps) == spacing * 1000)


def test_mutated_payloads_are_refused_with_a_reason_or_decode_to_what_they_say() -> None:
    """Random damage to the vectors: a documented reason, never another exception; what
    still decodes re-encodes to the same bytes (one meaning per payload)."""
    rng = np.random.default_rng(2026)
    seeds = [bytes.fromhex(v["hex"]) for v in blocks("lorawan") if "payload_bits=6" in v["params"]]
    refused: list[str] = []
    for _ in range(5000):
        data = mutated(seeds[int(rng.integers(0, len(seeds)))], rng)
        try:
            batch = decode_lorawan(
                data, STREAM_A, stream="temps", device="dev1", frame_counter=0, received_ms=RECEIVED
            )
        except WireError as exc:
            refused.append(exc.reason)
            continue
        spacing = 0 if len(batch) == 1 else int(np.diff(batch.timestamps)[0]) // 1000
        again = encode_lorawan(
            STREAM_A, stream="temps", device="dev1", codes=batch.codes, spacing_seconds=spacing
        )
        assert again == data
    assert set(refused) <= set(REASONS)
    assert len(refused) > 2500


def test_a_foreign_tag_passes_at_the_stated_rate() -> None:
    """Payloads of 200,000 other devices (or as many stale configurations: any other
    fingerprint) checked against one device's tag: the share that passes is 2^-12, within
    5 standard deviations of the binomial count."""
    trials = 200_000
    target = encode_lorawan(STREAM_A, stream="temps", device="dev1", codes=[42])
    passed = 0
    for i in range(trials):
        other = encode_lorawan(STREAM_A, stream="temps", device=f"other-{i}", codes=[42])
        passed += other[:2] == target[:2]
    p = 2.0**-TAG_BITS
    sd = (trials * p * (1 - p)) ** 0.5
    print(f"{passed} of {trials:,} foreign tags passed; expected {trials * p:.1f} ± {sd:.1f}")
    assert abs(passed - trials * p) <= 5 * sd


def test_what_cannot_be_encoded_is_refused() -> None:
    params = CodecParams(bytes(8), 6, code_min=31, code_max=63)
    cases = [
        ({"codes": []}, "bad_count"),
        ({"codes": [[31]]}, "bad_count"),
        ({"codes": [30]}, "bad_code"),
        ({"codes": [31, 64], "spacing_seconds": 1}, "bad_code"),
        ({"codes": [31, 31], "spacing_seconds": -1}, "bad_timestamp"),
        ({"codes": [31, 31], "spacing_seconds": 1 << 32}, "bad_timestamp"),
        ({"codes": [31, 31], "spacing_seconds": 1.5}, "bad_timestamp"),
        ({"codes": [31] * 400, "spacing_seconds": 1}, "too_large"),
    ]
    for kwargs, reason in cases:
        with pytest.raises(WireError) as info:
            encode_lorawan(params, stream="s", device="d", **kwargs)  # type: ignore[arg-type]
        assert info.value.reason == reason, kwargs
    with pytest.raises(ValueError, match="frame_counter"):
        decode_lorawan(b"\x00", params, stream="s", device="d", frame_counter=-1, received_ms=0)
