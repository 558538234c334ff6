"""The OpenAPI document changes only on purpose: it equals the committed docs/openapi.json."""

from __future__ import annotations

from tools.openapi import COPY, document


def test_the_openapi_document_equals_the_committed_copy() -> None:
    """A route, parameter or schema that changes shows up here; after an intended change,
    `python tools/openapi.py` rewrites the copy (and the diff shows what changed)."""
    assert document() == COPY.read_text(), "run `python tools/openapi.py` if intended"
