"""Zeal edge agent (issue 3): reads a sensor, perturbs with :mod:`zeal`, publishes codes.

Only the package exists so far; the agent itself is built in the next issue.
"""

__all__: list[str] = []
