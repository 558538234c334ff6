"""An agent's claim on its device id, on the device's retained presence topic.

Two agents sending as one device would interleave their sequence numbers and spend the
device's privacy budget twice. So each agent instance (an id kept in its outbox) announces
itself on ``zeal/v1/{stream}/{device}/presence``, retained, with a Last Will that marks it
offline if it vanishes (``zeal.mqtt.topics.Presence``):

1. After each connect, the broker delivers the topic's retained message right after the
   SUBACK. Once ``RETAINED_GRACE`` has passed since, the claim is announced (online).
2. An online presence of *another* instance before that means the device runs elsewhere:
   the newcomer refuses to start. One arriving later (two agents started together) is
   settled by age: the younger gives way, the older announces itself again.
3. On a clean stop the agent marks itself offline, unless another instance's message was
   the last one seen (it must not overwrite that one).
"""

from __future__ import annotations

import logging
import time

from zeal.mqtt.topics import Presence, TopicError
from zeal_edge.mqtt import Connection

__all__ = ["RETAINED_GRACE", "DeviceClaim"]

log = logging.getLogger(__name__)
#: After the SUBACK, how long a retained presence message may take to arrive (seconds).
RETAINED_GRACE = 0.5


class DeviceClaim:
    """The presence protocol of one agent (module docstring); used from the agent's thread."""

    def __init__(
        self, connection: Connection, topic: str, *, instance: str, started_ms: int, name: str
    ) -> None:
        self.connection, self.topic, self.name = connection, topic, name
        self.instance, self.started_ms = instance, started_ms
        #: The connection (its SUBACK count) the claim was last announced on; 0: never.
        self.announced = 0
        self._subacked: tuple[int, float] = (0, 0.0)
        self._last_owner: str | None = None

    def due(self) -> bool:
        """Whether the retained presence of this connection had time to arrive, and the
        claim is not yet announced on it."""
        count = self.connection.subscribed
        if count == 0 or count == self.announced:
            return False
        if self._subacked[0] != count:
            self._subacked = (count, time.monotonic())
            return False
        return time.monotonic() - self._subacked[1] >= RETAINED_GRACE

    def announce(self) -> None:
        self.announced = self.connection.subscribed
        self._publish(online=True, since_ms=self.started_ms)

    def seen(self, payload: bytes) -> str | None:
        """A presence message arrived: the reason this agent must stop, or None."""
        if not payload:
            return None
        try:
            presence = Presence.from_json(payload)
        except TopicError as exc:
            log.warning("ignoring a presence message on %s: %s", self.topic, exc)
            return None
        self._last_owner = presence.instance
        if presence.instance == self.instance or not presence.online:
            return None
        if self.announced and (presence.since_ms, presence.instance) > (
            self.started_ms,
            self.instance,
        ):
            log.warning(
                "another agent (instance %s) started as %s; it was told to stop",
                presence.instance,
                self.name,
            )
            self._publish(online=True, since_ms=self.started_ms)
            return None
        return (
            f"{self.name} is already running elsewhere (agent instance {presence.instance}, "
            f"online since {_when(presence.since_ms)}, as announced on "
            f"{self.connection.settings.url}). Two agents must not share a device id: stop "
            "the other one or give this one another --device. (An agent that died less than "
            "a minute ago is still shown online until the broker notices; try again then.)"
        )

    def release(self, now_ms: int) -> None:
        """Mark this instance offline, if it is the last one seen on the topic."""
        if self.connection.connected and self._last_owner == self.instance:
            self._publish(online=False, since_ms=now_ms)

    def _publish(self, *, online: bool, since_ms: int) -> None:
        presence = Presence(self.instance, online, since_ms)
        self.connection.publish(self.topic, presence.to_json(), retain=True)
        self._last_owner = self.instance


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))
