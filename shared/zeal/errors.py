"""Errors raised by :mod:`zeal`.

Tree::

    ZealError                      base of everything the library raises on purpose
    ├── ParameterError (ValueError)  stream parameters that cannot be used
    │   └── FitError                   a model that cannot be fitted to these data
    ├── ReadingError   (ValueError)  readings that cannot be perturbed (NaN, inf, wrong shape)
    ├── CodeError      (ValueError)  codes or privatized floats that are not valid outputs
    ├── WireError      (ValueError)  a payload (or a batch to encode) that is not valid: .reason
    └── TopicError     (ValueError)  a topic, notice or presence document not in the layout

:class:`ZealWarning` marks uses that work but are not recommended (the paper's float sampler).

Every class is defined here, and this module imports nothing but the standard library.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "CodeError",
    "FitError",
    "ParameterError",
    "ReadingError",
    "TopicError",
    "WireError",
    "WireReason",
    "ZealError",
    "ZealWarning",
]

#: Every reason a payload can be refused for, in the order the decoder checks
#: (``zeal.wire.REASONS``).
WireReason = Literal[
    "empty",
    "too_large",
    "bad_version",
    "bad_flags",
    "truncated",
    "fingerprint_mismatch",
    "bad_varint",
    "bad_count",
    "bad_timestamp",
    "bad_padding",
    "bad_code",
    "trailing_bytes",
]


class ZealError(Exception):
    """Base class of the errors raised by :mod:`zeal`."""


class ParameterError(ZealError, ValueError):
    """Stream parameters are invalid or cannot be realized exactly."""


class FitError(ParameterError):
    """A statistical model cannot be fitted to the data given (a censored normal fit that
    does not converge or has no positive definite information): no estimate, no error."""


class ReadingError(ZealError, ValueError):
    """A reading cannot be perturbed (not finite, not a number, wrong shape)."""


class CodeError(ZealError, ValueError):
    """A code or privatized value is not an output the mechanism can produce."""


class ZealWarning(UserWarning):
    """A configuration that works but weakens the guarantees the project states."""


class WireError(ZealError, ValueError):
    """A payload (or a batch to encode) is not valid; ``reason`` says which check failed."""

    def __init__(self, reason: WireReason, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason: WireReason = reason


class TopicError(ZealError, ValueError):
    """A topic or a notice/presence document is not what the layout of zeal.mqtt.topics says."""
