"""Tests only: a Python process started with this folder on PYTHONPATH and
``ZEAL_TEST_CLOCK_SHIFT=S`` reads a wall clock S seconds ahead (``time.time``,
``time.time_ns``), as does every Python process it starts with the same environment (the
server, the agents). Zeal reads the date from those two functions only; the monotonic
clocks that time waits and timeouts stay real. Python loads ``sitecustomize`` at startup,
before any module could keep a reference to the real functions.

(libfaketime shifts C-level clocks too, but under Python 3.11 its shifted monotonic clock
makes every ``threading.Event.wait`` with a timeout wait hours, and with that clock left
real every ``time.sleep`` fails with EINVAL.)
"""

import os
import time

_SHIFT = os.environ.get("ZEAL_TEST_CLOCK_SHIFT")
if _SHIFT:
    _seconds = float(_SHIFT)
    _nanoseconds = round(_seconds * 1e9)
    _real_time, _real_time_ns = time.time, time.time_ns
    time.time = lambda: _real_time() + _seconds
    time.time_ns = lambda: _real_time_ns() + _nanoseconds
