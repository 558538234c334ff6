"""The topic layout and the notice/presence documents (zeal.mqtt.topics), and configuration
documents with their origin (zeal.mqtt.streamconfig.read_config)."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zeal import ParameterError, Zeal
from zeal.mqtt.streamconfig import config_document, read_config
from zeal.mqtt.topics import (
    Notice,
    Presence,
    TopicError,
    config_topic,
    data_topic,
    message_digest,
    notice_topic,
    parse_config_topic,
    parse_data_topic,
    presence_topic,
)

PARAMS = Zeal(lower=0, upper=110, epsilon=1)


def test_topics_round_trip_and_others_are_not_taken_for_them() -> None:
    """Each topic is built one way and parsed back; other shapes parse to None."""
    assert data_topic("temps", "d1") == "zeal/v1/temps/d1/up"
    assert parse_data_topic(data_topic("temps", "d1")) == ("temps", "d1")
    assert parse_config_topic(config_topic("temps")) == "temps"
    for topic in (notice_topic("t", "d"), presence_topic("t", "d"), "zeal/v2/t/d/up", "x"):
        assert parse_data_topic(topic) is None
        assert parse_config_topic(topic) is None


def test_notices_and_presence_round_trip() -> None:
    notice = Notice(
        "zs-1", "temps", "d1", "unknown_stream", "gone", 5, message_digest(b"x"), sequence=3
    )
    assert Notice.from_json(notice.to_json()) == notice
    presence = Presence("abc", True, 7)
    assert Presence.from_json(presence.to_json()) == presence


@given(st.binary(max_size=300))
def test_garbage_notices_and_presence_raise_topic_errors_only(payload: bytes) -> None:
    """Whatever arrives on a device's topics, the agent gets a TopicError or a document."""
    for kind in (Notice, Presence):
        with contextlib.suppress(TopicError):
            kind.from_json(payload)


#: A well-formed notice, for the malformed ones below.
GOOD = Notice("s", "t", "d", "r", "m", 1, "0123456789abcdef", 2).to_document()


@pytest.mark.parametrize(
    "document",
    [
        {**GOOD, "server": 1},
        {**GOOD, "issued_ms": True},
        {**GOOD, "issued_ms": None},
        {**GOOD, "digest": "0123"},
        {**GOOD, "digest": "0123456789ABCDEF"},
        {k: v for k, v in GOOD.items() if k != "digest"},
        {**GOOD, "format": "zeal-notice/1"},  # an older server's: bound to no message
        {"format": "zeal-notice/2", "server": "s"},
        {"format": "zeal-presence/1", "instance": "i", "online": "yes"},
        ["not", "an", "object"],
    ],
)
def test_documents_of_the_wrong_shape_are_refused(document: object) -> None:
    with pytest.raises(TopicError):
        Notice.from_json(json.dumps(document))
    with pytest.raises(TopicError):
        Presence.from_json(json.dumps(document))


def test_a_configuration_keeps_its_origin_and_older_ones_are_still_read() -> None:
    """server, created_ms and unit come with the parameters; a document without them (an
    older server) is read as before; wrong types are refused."""
    full = config_document("temps", PARAMS, server="zs-1", created_ms=9, unit="degF")
    config = read_config(json.dumps(full), stream="temps")
    assert (config.params, config.server, config.created_ms, config.unit) == (
        PARAMS,
        "zs-1",
        9,
        "degF",
    )
    bare = {k: v for k, v in full.items() if k not in ("server", "created_ms", "unit")}
    old = read_config(bare)
    assert (old.server, old.created_ms, old.unit) == (None, None, "")
    assert old.identity != config.identity
    for key, bad in (("server", 5), ("created_ms", "9"), ("created_ms", True), ("unit", 1)):
        with pytest.raises(ParameterError, match=key):
            read_config({**full, key: bad})
