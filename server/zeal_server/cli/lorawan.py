"""``zeal-server lorawan bind|list|unbind``: which stream a ChirpStack application's uplinks
go to (docs/lorawan.md), carried out by the running server over HTTP."""

from __future__ import annotations

import argparse
import urllib.parse
from collections.abc import Mapping

from zeal_server.cli.asking import Handler, ask, get, open_server
from zeal_server.cli.common import READS, WRITES, Commands, add_server_argument, command

__all__ = ["HANDLERS", "add_parsers"]


def add_parsers(commands: Commands) -> None:
    """``zeal-server lorawan bind|list|unbind``."""
    lorawan = command(
        commands,
        "lorawan",
        "LoRaWAN uplinks through ChirpStack (asks the running server: bind and unbind write, "
        "list reads)",
        (),
    )
    actions = lorawan.add_subparsers(dest="action", required=True, metavar="ACTION")
    bind = command(
        actions,
        "bind",
        "send a ChirpStack application's uplinks on an FPort to a stream" + WRITES,
        (),
        "write",
    )
    unbind = command(
        actions, "unbind", "remove a binding (what was stored stays)" + WRITES, (), "write"
    )
    for p in (bind, unbind):
        p.add_argument("application", help="ChirpStack's application id (a UUID)")
        p.add_argument(
            "--port",
            type=int,
            default=0,
            help="the FPort, 1 to 223 [0: the application's ports not bound on their own]",
        )
    bind.add_argument("--stream", required=True, help="the stream their readings go to")
    bind.add_argument(
        "--device-names",
        choices=("dev_eui", "device_name"),
        default="dev_eui",
        help="name devices by DevEUI or by ChirpStack device name [dev_eui]",
    )
    listed = command(actions, "list", "every binding" + READS, (), "read")
    for p in (bind, unbind, listed):
        add_server_argument(p)


def _binding(args: argparse.Namespace) -> str:
    application = urllib.parse.quote(args.application, safe="")
    return f"/lorawan/bindings/{application}/{args.port}"


def _port(port: int) -> str:
    return "its other ports" if port == 0 else f"FPort {port}"


def _bind(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    body = {"stream": args.stream, "device_names": args.device_names}
    b = ask(args, env, "PUT", _binding(args), body)
    print(
        f"uplinks of ChirpStack application {b['application_id']} on {_port(b['f_port'])} go to "
        f"stream {b['stream']}, devices named by {b['device_names']} (the collector takes "
        "it up at once)"
    )


def _bindings(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    bindings = get(args, env, "/lorawan/bindings")
    for b in bindings:
        print(
            f"{b['application_id']}  {_port(b['f_port'])}  ->  {b['stream']}  "
            f"(devices by {b['device_names']})"
        )
    if not bindings:
        print("no LoRaWAN bindings yet (zeal-server lorawan bind --help)")


def _unbind(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    with open_server(args, env, "DELETE", _binding(args), None):
        pass
    print(f"uplinks of application {args.application} on {_port(args.port)} are no longer stored")


#: (command, action) -> its handler: every command of this family, listed once.
HANDLERS: dict[tuple[str, str | None], Handler] = {
    ("lorawan", "bind"): _bind,
    ("lorawan", "list"): _bindings,
    ("lorawan", "unbind"): _unbind,
}
