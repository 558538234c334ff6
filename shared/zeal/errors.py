"""Errors raised by :mod:`zeal`.

Tree::

    ZealError                      base of everything the library raises on purpose
    ├── ParameterError (ValueError)  stream parameters that cannot be used
    │   └── FitError                   a model that cannot be fitted to these data
    ├── ReadingError   (ValueError)  readings that cannot be perturbed (NaN, inf, wrong shape)
    └── CodeError      (ValueError)  codes or privatized floats that are not valid outputs

:class:`ZealWarning` marks uses that work but are not recommended (the paper's float sampler).
"""

from __future__ import annotations

__all__ = ["CodeError", "FitError", "ParameterError", "ReadingError", "ZealError", "ZealWarning"]


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
