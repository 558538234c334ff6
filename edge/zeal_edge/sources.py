"""Reading sources: a CSV column (replayed at a speed-up), lines on stdin, a command's output.

A source is anything iterable over :class:`Reading`; adding one means writing a class with
``__iter__`` and registering its prefix in :func:`open_source`. Sources that know when a
reading was taken (a replayed file) stamp it; others leave the stamp to the agent.

A value that is not a finite number (text, an empty cell, NaN, inf) is skipped with a
warning naming its row or line, never its content (it may hold a raw reading), and counted
in the source's ``skipped``; the agent books that count in its outbox.
"""

from __future__ import annotations

import csv
import logging
import math
import queue
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Protocol

__all__ = [
    "END",
    "CommandSource",
    "CsvSource",
    "LineSource",
    "Reading",
    "Source",
    "open_source",
    "read_into",
]

log = logging.getLogger(__name__)
_TIME_FORMATS = ("%Y/%m/%d %H:%M:%S", "%Y/%m/%d %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S")


@dataclass(frozen=True)
class Reading:
    """One reading: its value, when it was taken (ms, or None for 'now'), its replay position."""

    value: float
    timestamp_ms: int | None = None
    offset: int | None = None


class Source(Protocol):
    """Something that yields readings until it is exhausted."""

    description: str
    skipped: int

    def __iter__(self) -> Iterator[Reading]: ...


def finite(text: str | None) -> float | None:
    """The number in `text`, or None unless it is a finite float."""
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _parse_time(text: str) -> float | None:
    for fmt in _TIME_FORMATS:
        try:
            return datetime.strptime(text.strip(), fmt).timestamp()
        except ValueError:
            continue
    return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class CsvSource:
    """Replays one column of a CSV file (with a header row).

    With a time column and ``speedup > 0``, readings are released at the recorded pace divided
    by the speed-up and stamped with that schedule; with ``speedup == 0`` as fast as possible,
    stamped on arrival. ``start`` skips rows already sent (resuming after a restart).
    """

    def __init__(
        self,
        path: Path,
        *,
        column: str,
        time_column: str | None = "date",
        speedup: float = 0.0,
        start: int = 0,
        limit: int | None = None,
    ) -> None:
        if not math.isfinite(speedup) or speedup < 0:
            raise ValueError(f"speedup must be >= 0, got {speedup!r}")
        self.path, self.column, self.time_column = path, column, time_column
        self.speedup, self.start, self.limit = speedup, start, limit
        self.description = f"csv:{path} column {column!r}"
        self.skipped = 0
        with path.open(newline="") as handle:
            header = next(csv.reader(handle), [])
        if column not in header:
            headless = header and all(_is_number(cell) for cell in header)
            raise ValueError(
                f"{path} has no column {column!r} (its first row: {', '.join(header)})"
                + (
                    "; it has no header row: add one (e.g. 'temp') and name it with --column"
                    if headless
                    else "; name the column to read with --column"
                )
            )
        if time_column is not None and time_column not in header:
            self.time_column = None

    def __iter__(self) -> Iterator[Reading]:
        with self.path.open(newline="") as handle:
            rows = csv.DictReader(handle)
            first_time: float | None = None
            wall_start = time.time()
            emitted = 0
            for index, row in enumerate(rows):
                if index < self.start:
                    continue
                if self.limit is not None and emitted >= self.limit:
                    return
                value = finite(row[self.column])
                if value is None:
                    # The cell itself is not logged: it may hold a raw reading (e.g. "52.3F").
                    self.skipped += 1
                    log.warning(
                        "%s row %d: column %r is not a finite number; skipped",
                        self.path,
                        index + 2,
                        self.column,
                    )
                    continue
                stamp: int | None = None
                if self.speedup > 0 and self.time_column is not None:
                    recorded = _parse_time(row[self.time_column] or "")
                    if recorded is not None:
                        first_time = recorded if first_time is None else first_time
                        due = wall_start + (recorded - first_time) / self.speedup
                        delay = due - time.time()
                        if delay > 0:
                            time.sleep(delay)
                        stamp = round(due * 1000)
                emitted += 1
                yield Reading(value, stamp, index + 1)


class LineSource:
    """Readings from text lines: ``VALUE`` or ``TIMESTAMP_MS,VALUE`` per line."""

    def __init__(self, stream: IO[str], description: str) -> None:
        self.stream, self.description = stream, description
        self.skipped = 0

    def __iter__(self) -> Iterator[Reading]:
        for number, line in enumerate(self.stream, start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            parts = text.split(",")
            value = finite(parts[-1]) if len(parts) <= 2 else None
            stamp: int | None = None
            if value is not None and len(parts) == 2:
                try:
                    stamp = int(parts[0])
                except ValueError:
                    value = None
            if value is None:
                self.skipped += 1
                log.warning(
                    "%s line %d is not 'VALUE' or 'TIMESTAMP_MS,VALUE' with a finite number; "
                    "skipped",
                    self.description,
                    number,
                )
                continue
            yield Reading(value, stamp)


class CommandSource:
    """Readings from a command's standard output, one per line (see LineSource)."""

    def __init__(self, command: str) -> None:
        self.argv = shlex.split(command)
        if not self.argv:
            raise ValueError("cmd: needs a command")
        self.description = f"cmd:{command}"
        self.skipped = 0

    def __iter__(self) -> Iterator[Reading]:
        with subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True) as process:
            assert process.stdout is not None
            lines = LineSource(process.stdout, self.description)
            for reading in lines:
                self.skipped = lines.skipped
                yield reading
            self.skipped = lines.skipped
        if process.returncode:
            log.warning("%s exited with status %d", self.description, process.returncode)


class WindowMeans:
    """Window-mean reporting: the mean of each window's readings (windows of `seconds`,
    aligned to UTC), stamped at the window's start, instead of every reading. A window
    costs one reading's privacy loss, whatever it holds. Each reading is clipped to the
    stream's range first, as the mechanism would, so the value privatized is the mean of
    what per-reading mode would privatize. A window is reported once a reading of a later
    window arrives, or the source ends. Raw readings and their sum stay in memory."""

    def __init__(self, source: Source, seconds: int, bounds: tuple[float, float]) -> None:
        self.source, self.window_ms, self.bounds = source, seconds * 1000, bounds
        self.description = f"{source.description}, one mean per {seconds} s window"
        self.skipped = 0  # the source's, followed as it reads

    def __iter__(self) -> Iterator[Reading]:
        low, high = self.bounds
        current, total, count, offset = 0, 0.0, 0, None
        for r in self.source:
            self.skipped = self.source.skipped
            stamp = int(time.time() * 1000) if r.timestamp_ms is None else r.timestamp_ms
            window = stamp // self.window_ms
            if count and window != current:
                yield Reading(total / count, current * self.window_ms, offset)
                total, count = 0.0, 0
            current, offset = window, r.offset
            total, count = total + min(max(r.value, low), high), count + 1
        self.skipped = self.source.skipped
        if count:
            yield Reading(total / count, current * self.window_ms, offset)


def open_source(
    spec: str,
    *,
    column: str = "temp",
    speedup: float = 0.0,
    start: int = 0,
    limit: int | None = None,
) -> Source:
    """A source from its spec: ``csv:PATH``, ``stdin`` (or ``-``), or ``cmd:COMMAND``."""
    if spec in ("stdin", "-"):
        return LineSource(sys.stdin, "stdin")
    kind, _, rest = spec.partition(":")
    if kind == "csv" and rest:
        return CsvSource(Path(rest), column=column, speedup=speedup, start=start, limit=limit)
    if kind == "cmd" and rest:
        return CommandSource(rest)
    raise ValueError(f"unknown source {spec!r}: use csv:PATH, stdin or cmd:COMMAND")


#: What ``read_into`` puts on the queue after the last reading.
END = object()


def read_into(source: Source, inbox: queue.Queue[Any], stop: threading.Event) -> None:
    """Move the source's readings onto `inbox` until it ends or `stop` is set, then END (a
    thread's target: the agent's loop never waits on a slow source). A failing source is
    logged with its traceback and ends like an exhausted one."""
    readings = iter(source)
    try:
        for reading in readings:
            while not stop.is_set():
                try:
                    inbox.put(reading, timeout=0.5)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
    except Exception:
        log.exception("source failed")
    finally:
        close = getattr(readings, "close", None)
        if close is not None:  # a generator source closes its file now, not at collection
            close()
        inbox.put(END)
