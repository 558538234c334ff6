"""One agent per device and data directory: an exclusive file lock held for the life of
the agent process."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from zeal_edge.errors import AgentError

__all__ = ["DataDirLock"]


class DataDirLock:
    """An exclusive lock on one stream and device of a data directory, for the life of the
    agent process that sends them (agents of other devices may share the directory)."""

    def __init__(self, directory: Path, stream: str, device: str) -> None:
        folder = directory / "locks" / stream
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{device}.lock"
        self._handle: IO[str] | None = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._handle.seek(0)
            holder = self._handle.read().strip() or "another process"
            self._handle.close()
            self._handle = None
            raise AgentError(
                f"device {device} of stream {stream} is already running from the data "
                f"directory {directory} ({holder}): stop that agent first"
            ) from None
        self._handle.seek(0)
        self._handle.truncate()
        self._handle.write(f"zeal-edge pid {os.getpid()}\n")
        self._handle.flush()

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
