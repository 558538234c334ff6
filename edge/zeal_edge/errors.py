"""The edge package's exceptions::

EdgeError
├── SettingsError (ValueError)   a setting is missing or invalid: exit status 2
├── AgentError (RuntimeError)    the agent must not go on: exit status 3
│                                (data directory or device id in use elsewhere,
│                                the server no longer accepts the stream)
├── OutboxError (RuntimeError)   the outbox does not hold what was asked (an unknown
│                                stream namespace, a sequence that is not the next one)
├── PublishError (RuntimeError)  paho refused to queue a message
└── UnverifiedError (ValueError) a configuration or notice its server did not sign
                                 (ignored and counted, never acted on)
"""

from __future__ import annotations

__all__ = [
    "AgentError",
    "EdgeError",
    "OutboxError",
    "PublishError",
    "SettingsError",
    "UnservedStreamError",
    "UnverifiedError",
]


class EdgeError(Exception):
    """Base of the edge agent's errors."""


class SettingsError(EdgeError, ValueError):
    """A setting is missing or invalid; the message names it and where it came from."""


class AgentError(EdgeError, RuntimeError):
    """The agent stops and must not simply be restarted; the message says why and what to do.

    Exit status 3 (the systemd unit does not restart on it).
    """

    exit_code = 3


class UnservedStreamError(AgentError):
    """No server on the broker serves the agent's stream, while others are served: a wrong
    name (or a deleted stream). Exit status 2, as a bad setting."""

    exit_code = 2


class OutboxError(EdgeError, RuntimeError):
    """The outbox does not hold what was asked, or a write would break its sequence."""


class PublishError(EdgeError, RuntimeError):
    """paho refused to queue a message (not a missing connection: those wait)."""


class UnverifiedError(EdgeError, ValueError):
    """A message on a configuration or notice topic that does not verify under the key the
    agent trusts (zeal_edge.trust); the message says why."""
