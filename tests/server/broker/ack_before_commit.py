"""`zeal-server` with a deliberate bug, for tests/server/broker/test_cluster.py: the JetStream
source acknowledges each message as soon as it is fetched, before the transaction that
stores it commits. A collector killed then loses what it had acknowledged."""

from __future__ import annotations

import sys
from typing import Any

from zeal_server.broker import jetstream
from zeal_server.cli import main

_take = jetstream.JetStreamSource._take


def _take_and_ack(self: jetstream.JetStreamSource, message: Any) -> None:
    _take(self, message)
    self._refused.append(message)  # acknowledged right after this fetch: before the commit


jetstream.JetStreamSource._take = _take_and_ack  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
