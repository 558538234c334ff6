"""Waiting for a state, never for a time: the one `wait_until` of tests/ and bench/."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(check: Callable[[], object], timeout: float = 60.0, what: str = "") -> None:
    """Return as soon as `check()` is true; after `timeout` seconds of it being false, fail
    with `what` named. The timeout is a bound on a busy machine, not a rate: nothing here
    waits for a time to pass."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or check}")
        time.sleep(0.1)  # a poll's interval; the state is what is waited for
