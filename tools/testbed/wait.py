"""Waiting for a state, never for a time: the one `wait_until` of tests/ and bench/."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T], timeout: float = 60.0, what: str = "", *, every: float = 0.1
) -> T:
    """Return `check()`'s first true answer, as soon as there is one; after `timeout` seconds
    of false answers, fail (AssertionError) with `what` named. The timeout is a bound on a
    busy machine, not a rate: nothing here waits for a time to pass. `check` may raise to
    end the wait early (a process that died)."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or check}")
        time.sleep(every)  # why it sleeps: the interval between two polls of the state
    return found
