"""Wire format v2: documented vectors, round trips, sizes, and refusal of garbage."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.shared.helpers import STREAM_A, blocks, mutated, stream_of, timestamps_of
from zeal import REASONS, Batch, CodecParams, WireError, decode_batch, encode_batch
from zeal.wire import wire_fingerprint


def test_documented_vectors_encode_and_decode() -> None:
    """Each vector in docs/wire-format.md encodes to its hex and decodes to its fields."""
    vectors = blocks("vector")
    assert len(vectors) >= 5
    for v in vectors:
        params = stream_of(v["params"])
        stamps, codes = timestamps_of(v["timestamps"]), [int(c) for c in v["codes"].split()]
        payload = encode_batch(
            params,
            stream=v["stream"],
            device=v["device"],
            sequence=int(v["sequence"]),
            timestamps=stamps,
            codes=codes,
        )
        assert payload.hex() == v["hex"], v["name"]
        where = {"stream": v["stream"], "device": v["device"]}
        batch = decode_batch(bytes.fromhex(v["hex"]), params, **where)
        assert batch.sequence == int(v["sequence"])
        assert batch.timestamps.tolist() == stamps
        assert batch.codes.tolist() == codes
        assert batch.fingerprint == wire_fingerprint(params, v["stream"], v["device"])
        with pytest.raises(WireError, match="fingerprint_mismatch"):
            decode_batch(bytes.fromhex(v["hex"]), params, **{**where, "device": "another-device"})
        with pytest.raises(WireError, match="fingerprint_mismatch"):
            decode_batch(bytes.fromhex(v["hex"]), params, **{**where, "stream": "another-stream"})


def test_documented_invalid_payloads_give_their_reason() -> None:
    """Each invalid vector is refused with exactly the documented reason."""
    invalid = blocks("invalid")
    assert {v["reason"] for v in invalid} >= {
        "bad_version",
        "fingerprint_mismatch",
        "truncated",
        "trailing_bytes",
        "bad_code",
        "bad_padding",
    }
    for v in invalid:
        with pytest.raises(WireError) as info:
            decode_batch(bytes.fromhex(v["hex"]), STREAM_A, stream="temps", device="dev1")
        assert info.value.reason == v["reason"]


def test_size_targets() -> None:
    """60 readings at 6 bits (periodic) fit in 64 bytes; a single reading in 16."""
    stamps = [1767225600000 + 1000 * i for i in range(60)]
    codes = STREAM_A.perturb(np.full(60, 50.0))
    assert (
        len(
            encode_batch(
                STREAM_A,
                stream="temps",
                device="dev1",
                sequence=2**20,
                timestamps=stamps,
                codes=codes,
            )
        )
        <= 64
    )
    one = encode_batch(
        STREAM_A,
        stream="temps",
        device="dev1",
        sequence=2**20,
        timestamps=[1767225600000],
        codes=codes[:1],
    )
    assert len(one) <= 16


@st.composite
def batches(draw: st.DrawFn) -> tuple[CodecParams, int, list[int], list[int]]:
    bits = draw(st.integers(1, 32))
    fingerprint = draw(st.binary(min_size=4, max_size=8))
    count = draw(st.integers(1, 10_000))
    base = draw(st.integers(0, 2**47))
    if draw(st.booleans()):
        period = draw(st.integers(0, (2**48 - 1 - base) // max(1, count - 1)))
        stamps = [base + i * period for i in range(count)]
    else:
        seed = draw(st.integers(0, 2**32))
        steps = np.random.default_rng(seed).integers(
            0, 1 + draw(st.sampled_from([1, 1000, 10**9])), count - 1
        )
        stamps = np.concatenate([[base], base + np.cumsum(steps)]).tolist() if count > 1 else [base]
        if stamps[-1] >= 2**48:
            stamps = [base] * count
    seed = draw(st.integers(0, 2**32))
    codes = np.random.default_rng(seed).integers(0, 1 << bits, count, dtype=np.uint64).tolist()
    sequence = draw(st.integers(0, 2**64 - 1))
    return CodecParams(fingerprint, bits), sequence, stamps, codes


@settings(max_examples=300, deadline=None)
@given(batches())
def test_any_valid_batch_round_trips(case: tuple[CodecParams, int, list[int], list[int]]) -> None:
    """Widths 1..32, 1..10,000 readings, periodic or irregular: decode(encode(b)) == b."""
    params, sequence, stamps, codes = case
    payload = encode_batch(
        params, stream="s", device="d", sequence=sequence, timestamps=stamps, codes=codes
    )
    batch = decode_batch(payload, params, stream="s", device="d")
    expected = Batch(
        wire_fingerprint(params, "s", "d"),
        sequence,
        np.array(stamps, dtype=np.int64),
        np.array(codes, dtype=np.uint64),
    )
    assert batch == expected
    # Wrong length or fingerprint never decodes.
    for broken in (payload[:-1], payload + b"\x00"):
        with pytest.raises(WireError, match=r"^(truncated|trailing_bytes):"):
            decode_batch(broken, params, stream="s", device="d")
    other = CodecParams(bytes(b ^ 0xFF for b in params.fingerprint), params.payload_bits)
    with pytest.raises(WireError) as info:
        decode_batch(payload, other, stream="s", device="d")
    assert info.value.reason == "fingerprint_mismatch"
    # The same parameters under another stream's name (a replay on another stream) neither.
    with pytest.raises(WireError) as info:
        decode_batch(payload, params, stream="s2", device="d")
    assert info.value.reason == "fingerprint_mismatch"


FUZZ_INPUTS = 1_000_000


@pytest.mark.slow
def test_fuzzed_payloads_only_raise_wire_errors() -> None:
    """10**6 random and mutated payloads: each decodes to a valid batch or raises WireError
    (never another exception), and what decodes re-encodes to itself."""
    rng = np.random.default_rng(20261129)
    seeds = [bytes.fromhex(v["hex"]) for v in blocks("vector")]
    reasons: dict[str, int] = {}
    decoded = 0
    for i in range(FUZZ_INPUTS):
        if i % 4 == 0:
            payload = rng.bytes(int(rng.integers(0, 80)))
            if payload and rng.random() < 0.5:
                payload = (
                    bytes([0x20 | (payload[0] & 1)])
                    + wire_fingerprint(STREAM_A, "temps", "dev1")
                    + payload[1:]
                )
        else:
            payload = mutated(seeds[int(rng.integers(0, 4))], rng)
        try:
            batch = decode_batch(payload, STREAM_A, stream="temps", device="dev1")
        except WireError as exc:
            reasons[exc.reason] = reasons.get(exc.reason, 0) + 1
            continue
        decoded += 1
        assert batch.fingerprint == wire_fingerprint(STREAM_A, "temps", "dev1")
        assert (
            STREAM_A.code_min
            <= int(batch.codes.min())
            <= int(batch.codes.max())
            <= STREAM_A.code_max
        )
        again = encode_batch(
            STREAM_A,
            stream="temps",
            device="dev1",
            sequence=batch.sequence,
            timestamps=batch.timestamps,
            codes=batch.codes,
        )
        assert decode_batch(again, STREAM_A, stream="temps", device="dev1") == batch
    print(f"fuzz: {decoded} decoded, refusals by reason {dict(sorted(reasons.items()))}")
    assert set(reasons) <= set(REASONS)
    assert len(reasons) >= 8


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"sequence": -1, "timestamps": [0], "codes": [40]}, "bad_varint"),
        ({"sequence": 0, "timestamps": [], "codes": []}, "bad_count"),
        ({"sequence": 0, "timestamps": [0, 1], "codes": [40]}, "bad_count"),
        ({"sequence": 0, "timestamps": [5, 4], "codes": [40, 41]}, "bad_timestamp"),
        ({"sequence": 0, "timestamps": [2**48], "codes": [40]}, "bad_timestamp"),
        ({"sequence": 0, "timestamps": [0], "codes": [64]}, "bad_code"),
    ],
)
def test_unencodable_batches_are_refused(kwargs: dict, reason: str) -> None:
    """encode_batch refuses batches it could not decode back, with the matching reason."""
    with pytest.raises(WireError) as info:
        encode_batch(STREAM_A, stream="temps", device="dev1", **kwargs)
    assert info.value.reason == reason


def test_not_bytes_is_refused() -> None:
    """A payload that is not bytes is refused, not crashed on."""
    with pytest.raises(WireError, match="empty"):
        decode_batch("20d8", STREAM_A, stream="temps", device="dev1")  # type: ignore[arg-type]
