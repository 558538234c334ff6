"""The protocol contract written once: names, parameter limits and the closed catalogue of
reject reasons, and the places that must agree with it (mechanism, API schemas, collector,
edge agent, docs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zeal import REASONS, ParameterError, Zeal, ZealWarning
from zeal.protocol import (
    COLLECTOR_REASONS,
    EPSILON_CEILING,
    EPSILON_MAX,
    EXPONENT,
    PAYLOAD_BITS,
    REJECT_REASONS,
    check_name,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_catalogue_holds_the_wire_reasons_first_then_the_collectors() -> None:
    assert list(REJECT_REASONS)[: len(REASONS)] == list(REASONS)
    assert list(REJECT_REASONS)[len(REASONS) :] == list(COLLECTOR_REASONS)
    assert not set(REASONS) & set(COLLECTOR_REASONS)
    assert all(meaning and meaning[0].islower() for meaning in REJECT_REASONS.values())


def test_the_server_docs_name_every_collector_reason() -> None:
    text = (ROOT / "docs" / "server.md").read_text()
    assert [r for r in COLLECTOR_REASONS if f"`{r}`" not in text] == []


@pytest.mark.parametrize("name", ["a", "kitchen-1", "A.b_c", "9" * 64])
def test_valid_names(name: str) -> None:
    assert check_name("device", name) == name


@pytest.mark.parametrize("name", ["", "-a", ".a", "a/b", "a+", "#", "a" * 65, 7, None])
def test_invalid_names_are_refused_with_the_rule(name: object) -> None:
    with pytest.raises(ParameterError, match="1 to 64 letters"):
        check_name("device", name)


def test_the_mechanism_enforces_the_protocol_limits() -> None:
    Zeal(lower=0.0, upper=1.0, epsilon=EPSILON_MAX)
    with pytest.raises(ParameterError, match=re.escape(f"(0, {EPSILON_MAX}]")):
        Zeal(lower=0.0, upper=1.0, epsilon=EPSILON_MAX * 1.0001)
    for bits in PAYLOAD_BITS:
        with pytest.warns(ZealWarning, match="kept for comparison"):
            made = Zeal(lower=0.0, upper=1.0, epsilon=1.0, payload_bits=bits, sampler="paper")
        assert made.payload_bits == bits  # the grid sampler has its own, lower ceiling
    for bits in (PAYLOAD_BITS[0] - 1, PAYLOAD_BITS[1] + 1):
        with pytest.raises(ParameterError, match="payload_bits"):
            Zeal(lower=0.0, upper=1.0, epsilon=1.0, payload_bits=bits)
    with pytest.raises(ParameterError, match="exponent"):
        Zeal(lower=0.0, upper=1.0, epsilon=1.0, exponent=EXPONENT[1] + 1)


def test_the_api_schema_states_the_same_limits() -> None:
    """The OpenAPI document's bounds for a new stream are the protocol's numbers."""
    from zeal_server.api.schemas import StreamIn

    fields = StreamIn.model_json_schema()["properties"]
    assert fields["epsilon"]["maximum"] == EPSILON_CEILING <= EPSILON_MAX
    assert [fields["exponent"]["anyOf"][0][k] for k in ("minimum", "maximum")] == list(EXPONENT)
    assert fields["payload_bits"]["anyOf"][0]["minimum"] == PAYLOAD_BITS[0]


def test_the_collector_records_only_catalogue_reasons() -> None:
    """Reasons the server tells devices about and the agent halts on are in the catalogue;
    recording any other reason is refused."""
    from zeal_edge.notices import FATAL
    from zeal_server.broker.notices import NOTICES
    from zeal_server.ingest import Ingest

    assert set(NOTICES) - {"sequence_reset", "sequence_jump"} <= set(REJECT_REASONS)
    assert set(FATAL) <= set(REJECT_REASONS)
    with pytest.raises(AssertionError, match="not in the reject catalogue"):
        Ingest().reject(None, "s", "d", "bad_mood", when=0)  # type: ignore[arg-type]
