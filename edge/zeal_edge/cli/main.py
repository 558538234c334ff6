"""``zeal-edge``: run the agent, show its state, or simulate a fleet.

zeal-edge run --stream NAME --device ID --source SPEC [--broker URL] [--batch N] ...
zeal-edge status [--data-dir DIR] [--json]
zeal-edge resume [--data-dir DIR]       clear a halt (the server had stopped accepting)
zeal-edge forget STREAM/DEVICE [--data-dir DIR] [--force]   remove a stream's entry
zeal-edge simulate --devices N --source csv:FILE --stream NAME [--rate R] ...

Exit status: 0 done, 2 a bad setting (a stream no server serves included), 3 the agent
must not go on (its device id runs elsewhere, or the server no longer accepts its stream);
the message says why.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from zeal import ParameterError
from zeal_edge.cli.run import RUN, run
from zeal_edge.cli.state import forget, resume, status
from zeal_edge.errors import AgentError
from zeal_edge.settings import SettingsError, add_arguments

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    """The command line of ``zeal-edge`` and its commands."""
    top = argparse.ArgumentParser(
        prog="zeal-edge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = top.add_subparsers(dest="command", required=True)
    run_command = commands.add_parser(
        "run",
        help="privatize a sensor's readings and publish them",
        description="Settings come from options, ZEAL_* variables or a "
        "TOML --config file, in that order of precedence.",
    )
    add_arguments(run_command, RUN)
    run_command.add_argument(
        "--wait",
        action="store_true",
        help="wait for the stream to be created when no server serves it yet (without it, "
        "the agent ends with exit status 2 naming the streams served)",
    )
    status_command = commands.add_parser(
        "status", help="outbox depth, sequences and privacy budget"
    )
    add_arguments(status_command, {"data_dir"})
    status_command.add_argument("--json", action="store_true", help="machine-readable output")
    resume_command = commands.add_parser(
        "resume",
        help="clear a halt, so the agent sends its stream again",
        description="An agent halts when its server, in messages signed with its key, says "
        "it no longer accepts the stream (deleted), or gives it a configuration it must not "
        "follow (the stream created anew, a policy above the agent's ceiling). This clears "
        "the halt and the pinned origin: the next configuration signed with the server's "
        "key is adopted and pinned. (An agent run with --on-halt wait needs no visit: "
        "zeal-server streams release NAME frees it.)",
    )
    add_arguments(resume_command, {"data_dir"})
    forget_command = commands.add_parser(
        "forget",
        help="remove a stream and device from this agent's state (zeal-edge status)",
        description="Removes what the agent keeps for STREAM/DEVICE: its status entry, "
        "sequence numbers, batches, reported rejects and privacy spend. It refuses while "
        "batches are queued or epsilon was spent (the spend keeps the stream's policy "
        "per day) unless --force: a run started again would begin at sequence 0.",
    )
    forget_command.add_argument(
        "entry", metavar="STREAM/DEVICE", help="as zeal-edge status names it"
    )
    forget_command.add_argument(
        "--force", action="store_true", help="drop queued batches and spend"
    )
    add_arguments(forget_command, {"data_dir"})
    from zeal_edge.simulate import add_simulate_arguments

    add_simulate_arguments(
        commands.add_parser(
            "simulate", help="many virtual devices replaying a dataset (demos and load tests)"
        )
    )
    return top


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    args = parser().parse_args(argv)
    try:
        if args.command == "simulate":
            from zeal_edge.simulate import run_simulation

            return run_simulation(args)
        command = {"run": run, "status": status, "resume": resume, "forget": forget}
        return command[args.command](args)
    except AgentError as exc:
        print(f"zeal-edge: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (SettingsError, ParameterError, ValueError, OSError) as exc:
        print(f"zeal-edge: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
