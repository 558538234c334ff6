"""The edge package's exceptions::

EdgeError
├── SettingsError (ValueError)   a setting is missing or invalid: exit status 2
└── AgentError (RuntimeError)    the agent must not go on: exit status 3
                                 (data directory or device id in use elsewhere,
                                 the server no longer accepts the stream)
"""

from __future__ import annotations

__all__ = ["AgentError", "EdgeError", "SettingsError"]


class EdgeError(Exception):
    """Base of the edge agent's errors."""


class SettingsError(EdgeError, ValueError):
    """A setting is missing or invalid; the message names it and where it came from."""


class AgentError(EdgeError, RuntimeError):
    """The agent stops and must not simply be restarted; the message says why and what to do.

    Exit status 3 (the systemd unit does not restart on it).
    """

    exit_code = 3
