"""Names renamed to the one vocabulary of docs/api.md: their old spelling still works for
one release and says so (the server's query names: ``zeal_server.api.vocabulary``).

``renamed(parser, old, new)`` adds a hidden command-line option that stores into the new
one's destination and warns on stderr; ``renamed_env(env, old, new)`` reads an environment
variable under its new name, or its old one with a warning.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["renamed", "renamed_env", "said"]


def said(old: str, new: str) -> str:
    return f"{old} is now {new}; the old name goes in the next release"


class _Renamed(argparse.Action):
    def __init__(self, *args: Any, new: str, flag: bool, **kwargs: Any) -> None:
        self.new, self.flag = new, flag
        super().__init__(*args, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog}: {said(str(option_string), self.new)}", file=sys.stderr)
        setattr(namespace, self.dest, True if self.flag else values)


def renamed(
    parser: argparse.ArgumentParser, old: str, new: str, dest: str, flag: bool = False
) -> None:
    """``old`` as a hidden option of ``parser``: it sets ``dest`` as ``new`` would (True
    for a flag) and warns. ``new`` is what the warning names, e.g. ``--confirm NAME``."""
    parser.add_argument(
        old,
        dest=dest,
        nargs=0 if flag else None,
        action=_Renamed,
        new=new,
        flag=flag,
        help=argparse.SUPPRESS,
        default=argparse.SUPPRESS,
    )


def renamed_env(env: Mapping[str, str], old: str, new: str, program: str) -> str | None:
    """The variable ``new``, else ``old`` with a warning on stderr, else None."""
    if new in env:
        return env[new]
    if old in env:
        print(f"{program}: {said(old, new)}", file=sys.stderr)
        return env[old]
    return None
