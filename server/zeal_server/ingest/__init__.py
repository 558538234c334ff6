"""Ingest: one transaction of data messages, validated side by side, stream by stream, and
stored through ``zeal_server.store``. It knows no MQTT: the broker layer hands it (topic,
payload, arrival time) and acknowledges after the commit.

``Ingest`` (``ingest.storing``) validates each message completely, then stores it once;
``ingest.groups`` holds the messages, the outcomes and the plausibility limits;
``ingest.settle`` stores one round (sequence states, the privacy ledger, the segment
parts); ``ingest.rejectkeys`` pools the keys of rejects.
"""

from zeal_server.ingest.groups import Arrived, Message, Outcome
from zeal_server.ingest.storing import MAX_REJECT_ROWS, Ingest, Original

__all__ = ["MAX_REJECT_ROWS", "Arrived", "Ingest", "Message", "Original", "Outcome"]
