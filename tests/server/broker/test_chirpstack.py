"""ChirpStack v4 uplink events (built with chirpstack-api's UplinkEvent, marshaled as
ChirpStack does: protobuf's JSON mapping, or protobuf) read into uplinks, and their
LoRaWAN-profile payloads turned into the wire-v2 batches the ingest path stores."""

from __future__ import annotations

import numpy as np
import pytest
from chirpstack_api.integration import UplinkEvent
from google.protobuf import json_format

from tests.server.broker.uplink_limits import json_limits, limit_events, mutated
from zeal import WireError, Zeal, decode_batch
from zeal.lorawan import encode_lorawan
from zeal_server.broker.chirpstack.events import ChirpStackError, parse_uplink, to_batch

PARAMS = Zeal(lower=0, upper=110, epsilon=1)
RECEIVED_MS = 1_767_225_600_123
DEV_EUI = "0102030405a6b7c8"


def event(data: bytes, *, f_cnt: int = 7, f_port: int = 10) -> UplinkEvent:
    up = UplinkEvent(deduplication_id="3b1a8e1e-6f7c-4c1e-9d7e-3c8f0c1d2e3f", f_cnt=f_cnt,
                     f_port=f_port, data=data, dr=5)  # fmt: skip
    up.time.FromMilliseconds(RECEIVED_MS)
    up.device_info.application_id = "a1b2c3d4-0000-4000-8000-000000000001"
    up.device_info.dev_eui = DEV_EUI.upper()
    up.device_info.device_name = "kitchen-1"
    return up


def marshaled(up: UplinkEvent) -> dict[str, bytes]:
    return {
        "json": json_format.MessageToJson(up).encode(),
        "protobuf": up.SerializeToString(),
    }


def test_json_and_protobuf_events_give_the_same_uplink_and_batch() -> None:
    codes = PARAMS.perturb(np.linspace(10, 100, 10), rng=np.random.default_rng(1))
    frame = encode_lorawan(PARAMS, stream="temps", device=DEV_EUI, codes=codes,
                           spacing_seconds=600)  # fmt: skip
    payloads = []
    for name, body in marshaled(event(frame)).items():
        up = parse_uplink(body)
        assert (up.dev_eui, up.device_name, up.f_port, up.f_cnt) == (DEV_EUI, "kitchen-1", 10, 7)
        assert (up.received_ms, up.data) == (RECEIVED_MS, frame), name
        payloads.append(to_batch(up, PARAMS, stream="temps", device=DEV_EUI))
    assert payloads[0] == payloads[1]  # one event, delivered twice: the same bytes
    batch = decode_batch(payloads[0], PARAMS, stream="temps", device=DEV_EUI)
    assert batch.sequence == 7
    assert batch.codes.tolist() == codes.tolist()
    assert batch.timestamps.tolist() == [RECEIVED_MS - (9 - i) * 600_000 for i in range(10)]


def test_a_frame_counter_of_zero_which_json_leaves_out_is_sequence_zero() -> None:
    frame = encode_lorawan(PARAMS, stream="temps", device=DEV_EUI, codes=[PARAMS.code_min])
    body = marshaled(event(frame, f_cnt=0))["json"]
    assert b"fCnt" not in body
    assert parse_uplink(body).f_cnt == 0


def test_a_stale_configuration_is_refused_by_its_tag() -> None:
    stale = Zeal(lower=0, upper=100, epsilon=1)
    frame = encode_lorawan(stale, stream="temps", device=DEV_EUI, codes=[stale.code_min])
    up = parse_uplink(marshaled(event(frame))["protobuf"])
    with pytest.raises(WireError) as info:
        to_batch(up, PARAMS, stream="temps", device=DEV_EUI)
    assert info.value.reason == "fingerprint_mismatch"


def test_events_that_are_not_usable_uplinks_say_why() -> None:
    frame = encode_lorawan(PARAMS, stream="temps", device=DEV_EUI, codes=[PARAMS.code_min])
    timeless = event(frame)
    timeless.ClearField("time")
    cases = {
        b"\xff\xff\xff": "bad_event",
        b'{"fCnt": "many"}': "bad_event",
        b"{\xff": "bad_event",
        marshaled(timeless)["json"]: "no_time",
        marshaled(event(frame, f_port=0))["protobuf"]: "no_data",
        marshaled(event(b""))["json"]: "no_data",
        marshaled(event(frame, f_port=300))["protobuf"]: "bad_event",  # not one byte
    }
    for body, reason in cases.items():
        with pytest.raises(ChirpStackError) as info:
            parse_uplink(body)
        assert info.value.reason == reason, body


def test_mutated_events_are_refused_with_a_reason_and_nothing_else() -> None:
    """5,000 events with 1 to 8 bytes changed, inserted or cut (JSON and protobuf): each is
    read into an uplink and a batch, or refused with ChirpStackError or WireError; no other
    exception reaches the collector's writer."""
    rng = np.random.default_rng(5)
    codes = PARAMS.perturb(np.linspace(10, 100, 10), rng=rng)
    frame = encode_lorawan(PARAMS, stream="temps", device=DEV_EUI, codes=codes,
                           spacing_seconds=600)  # fmt: skip
    bodies = list(marshaled(event(frame)).values())
    outcomes = {"batch": 0, "event": 0, "wire": 0}
    for body in mutated(bodies, 5000, rng):
        try:
            up = parse_uplink(body)
        except ChirpStackError:
            outcomes["event"] += 1
            continue
        try:
            to_batch(up, PARAMS, stream="temps", device=DEV_EUI)
            outcomes["batch"] += 1
        except WireError:
            outcomes["wire"] += 1
    assert min(outcomes.values()) >= 20, outcomes  # every path was taken


def test_every_field_at_the_limits_of_its_type_gives_an_uplink_or_a_reason() -> None:
    """Each UplinkEvent field at each limit of its type (protobuf and JSON; times far
    outside protobuf's range among them) is read into an uplink and a batch or refused
    with ChirpStackError or WireError, and nothing else."""
    frame = encode_lorawan(PARAMS, stream="temps", device=DEV_EUI, codes=[PARAMS.code_min])
    base = event(frame)
    cases = limit_events(base) + json_limits(base)
    refused: dict[str, str] = {}
    for name, body in cases:
        try:
            up = parse_uplink(body)
            to_batch(up, PARAMS, stream="temps", device=DEV_EUI)
        except (ChirpStackError, WireError) as exc:
            refused[name] = exc.reason
    assert len(cases) > 600
    assert refused["protobuf time.seconds=4611686018427387904"] == "bad_event"
    assert refused["protobuf time.nanos=-1"] == "bad_event"
    assert refused["json time=10000-01-01T00:00:00"] == "bad_event"
    assert refused["protobuf time.seconds=-1"] == "bad_timestamp"  # before 1970: the wire's
    assert "protobuf f_cnt=4294967295" not in refused  # the largest frame counter is one
