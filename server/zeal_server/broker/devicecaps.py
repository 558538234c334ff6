"""Telling devices their caps across streams (zeal.mqtt.topics.DeviceCapsNotice), so that an
agent keeps within the caps its server holds without an operator passing them to it.

A device is told on its notice topic of each stream it sent to, in a document signed for
``zeal.signed.CAPS_PURPOSE`` and bound to the server, the device, the database's revision
of caps (``store.caps_version``) and when it was issued (strictly later than this
process's previous notice of any kind):

- the first time this process stores or refuses a batch of the device (``seen``): an agent
  that starts, or whose collector restarted, hears its caps with its first batch;
- whenever a cap it depends on changed (a device's, a tag's, a device's tags: the revision
  moved), if its caps are not the ones it was told: within the collector's sync (2 s) of
  the change, while the agent runs, before it sends past a lowered cap.

Only devices this process told are followed (at most DEVICE_IDS of them, the most recently
seen); a device it forgot is told again when it next sends.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping

from sqlalchemy.orm import Session

from zeal import ParameterError
from zeal.mqtt.topics import DeviceCapsNotice, notice_topic
from zeal.protocol import check_name
from zeal.signed import CAPS_PURPOSE
from zeal_server import store
from zeal_server.broker.notices import Notifier
from zeal_server.ingest.bounded import Bounded
from zeal_server.ingest.storing import DEVICE_IDS

__all__ = ["CapsTeller"]


class CapsTeller:
    """Tells devices their caps through `notifier` (its signer, its publish, its clock of
    issued notices); `default` and `rolling` are the server's default caps."""

    def __init__(
        self,
        notifier: Notifier,
        default: float | None,
        rolling: Mapping[int, float | None],
    ) -> None:
        self.notifier, self.default, self.rolling = notifier, default, dict(rolling)
        #: Devices seen (network or writer thread) and not yet told: name -> its streams.
        self._new: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        #: What each device was told (its caps) and on which streams.
        self._told: Bounded[str, tuple[dict[int, float], set[str]]] = Bounded(DEVICE_IDS)
        self._revision: int | None = None

    def seen(self, pairs: Iterable[tuple[str, str]]) -> None:
        """(stream, device) of batches stored or refused: a device not told yet in this
        process, or on a stream it was not told on, is told at the next ``tell``."""
        for stream, device in pairs:
            known = self._told.find(device)
            if known is None or stream not in known[1]:
                with self._lock:
                    self._new.setdefault(device, set()).add(stream)

    @property
    def pending(self) -> bool:
        return bool(self._new)

    def tell(self, session: Session, server_id: str | None, revision: int | None) -> int:
        """Tell the new devices their caps, and, if the revision moved, every device told
        before whose caps changed. Returns how many documents were published."""
        if server_id is None or self.notifier.signer is None:
            return 0
        with self._lock:
            new, self._new = self._new, {}
        wanted = {device: set(streams) for device, streams in new.items()}
        if revision != self._revision:
            for device in self._told.ordered_keys():
                told = self._told.find(device)
                if told is not None:
                    wanted.setdefault(device, set()).update(told[1])
        self._revision = revision
        if not wanted:
            return 0
        caps = store.resolve_caps(session, sorted(wanted), self.default, self.rolling)
        sent = 0
        for device in sorted(wanted):
            told = self._told.find(device)
            streams = wanted[device] | (told[1] if told is not None else set())
            if told is not None and told[0] == caps[device]:
                to = wanted[device] - told[1]  # only the streams it was not told on
            else:
                to = streams
            self._told[device] = (caps[device], streams)
            for stream in sorted(to):
                sent += self._publish(server_id, stream, device, revision or 0, caps[device])
        return sent

    def _publish(
        self, server_id: str, stream: str, device: str, revision: int, caps: dict[int, float]
    ) -> int:
        try:
            check_name("stream", stream)
            check_name("device", device)
        except ParameterError:
            return 0
        signer = self.notifier.signer
        assert signer is not None
        document = DeviceCapsNotice(
            server=server_id,
            device=device,
            revision=revision,
            issued_ms=self.notifier.issue(),
            caps={days: caps.get(days) for days in (1, 30, 365)},
        )
        signed = signer.sign(document.to_document(), CAPS_PURPOSE)
        self.notifier.publish(notice_topic(stream, device), json.dumps(signed).encode())
        return 1
