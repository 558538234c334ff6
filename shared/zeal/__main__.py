"""Command line: ``python -m zeal audit ...``, ``demo`` and ``firmware-profile`` (the core's
throughput benchmark is ``bench/core_throughput.py``)."""

from __future__ import annotations

import argparse
import struct
import sys
import warnings

from zeal._core.mechanism import SAMPLERS, Zeal
from zeal.errors import ZealError, ZealWarning
from zeal.longitudinal import audit_memo, grid_step


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m zeal", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    audit = commands.add_parser(
        "audit",
        help="measure the privacy loss the sampler actually realizes",
        description="Report the realized privacy loss (max log probability ratio over "
        "outputs and input pairs), holes and the outputs checked.",
    )
    audit.add_argument("--lower", type=float, required=True, help="lower end of the feasible range")
    audit.add_argument("--upper", type=float, required=True, help="upper end of the feasible range")
    audit.add_argument("--epsilon", type=float, required=True, help="privacy budget per reading")
    width = audit.add_mutually_exclusive_group()
    width.add_argument("--payload-bits", type=int, help="code width in bits (default: chosen)")
    width.add_argument("--exponent", type=int, help="binade exponent E_U* (sets the width)")
    audit.add_argument(
        "--sampler",
        choices=SAMPLERS,
        default="grid",
        help="grid (exact, default) or paper (float64, for comparison)",
    )
    audit.add_argument(
        "--max-outputs",
        type=int,
        default=4096,
        help="outputs to check when there are more (default 4096)",
    )
    audit.add_argument(
        "--grid-points",
        type=int,
        help="also check a longitudinal stream's memo accounting exactly (zeal.longitudinal."
        "audit_memo): every pair of same-pattern histories of --times reports over this many "
        "grid values, every report sequence (small grids and widths only)",
    )
    audit.add_argument(
        "--times", type=int, default=3, help="reports per history for --grid-points (default 3)"
    )
    demo = commands.add_parser(
        "demo", help="privatize a CSV column and compare the served average with the truth"
    )
    demo.add_argument("csv", help="CSV file with a header row")
    demo.add_argument("--column", default="temp", help="column holding the readings")
    demo.add_argument("--lower", type=float, required=True, help="lower end of the range")
    demo.add_argument("--upper", type=float, required=True, help="upper end of the range")
    demo.add_argument("--epsilon", type=float, default=1.0, help="budget per reading")
    demo.add_argument("--payload-bits", type=int, help="code width (default: chosen)")
    firmware = commands.add_parser(
        "firmware-profile",
        help="a device's profile for the firmware library (edge/firmware)",
        description="Write the 96-byte profile a device needs to privatize and encode on the "
        "chip (docs/firmware.md), from the stream's configuration document.",
    )
    firmware.add_argument(
        "--reading-unit",
        type=float,
        required=True,
        help="what one step of the device's integer reading stands for, in the stream's "
        "unit (0.01 for readings in hundredths)",
    )
    firmware.add_argument(
        "--config", required=True, help="the stream's configuration (GET .../config), a file"
    )
    firmware.add_argument("--device", required=True, help="the device's name on the stream")
    firmware.add_argument(
        "--format", choices=("hex", "header"), default="hex", help="hex (default) or a C header"
    )
    return parser


def _firmware(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zeal._core.firmware import c_header, profile_bytes
    from zeal.mqtt.streamconfig import read_config
    from zeal.protocol import check_name

    try:
        text = Path(args.config).read_text()
    except OSError as exc:
        print(
            f"error: cannot read the configuration {args.config}: {exc.strerror}", file=sys.stderr
        )
        return 2
    config = read_config(text)
    blob = profile_bytes(
        config.params,
        stream=config.stream,
        device=check_name("device", args.device),
        unit=args.reading_unit,
    )
    print(blob.hex() if args.format == "hex" else c_header(blob), end="\n" * (args.format == "hex"))
    if config.params.grid_points is not None:  # what zeal_memo_init takes
        step = struct.unpack("<Q", struct.pack("<d", grid_step(config.params)))[0]
        print(
            f"longitudinal: zeal_memo_init(..., {config.params.grid_points}, 0x{step:016x}u, ...)"
            f" (grid_points, the step's binary64 bits)",
            file=sys.stderr,
        )
    return 0


def _demo(args: argparse.Namespace) -> int:
    import csv

    import numpy as np

    try:
        with open(args.csv, newline="") as handle:
            readings = np.array([float(row[args.column]) for row in csv.DictReader(handle)])
    except (OSError, KeyError, ValueError) as exc:
        print(f"error: cannot read column {args.column!r} of {args.csv}: {exc}", file=sys.stderr)
        return 2
    params = Zeal(
        lower=args.lower, upper=args.upper, epsilon=args.epsilon, payload_bits=args.payload_bits
    )
    codes = params.perturb(readings)  # on a device this happens before anything leaves it
    est = params.estimate_mean(codes)
    print(f"{params!r}")
    print(
        f"C = {params.C:.4f}, Abar = {params.abar!r}, realized epsilon = "
        f"{params.realized_epsilon:.12f}"
    )
    print(
        f"{est.n} readings from {args.csv}, {params.payload_bits} bits each on the wire "
        f"instead of 64 (transmission ratio {params.transmission_ratio:.3f})"
    )
    print(f"true average      {readings.mean():10.4f}")
    print(f"served average    {est.mean:10.4f}  (std error {est.std_error:.4f})")
    print(f"95 % normal CI    [{est.ci[0]:.4f}, {est.ci[1]:.4f}]")
    print(f"95 % guaranteed   [{est.guaranteed[0]:.4f}, {est.guaranteed[1]:.4f}]  (Theorem 3)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "firmware-profile":
            return _firmware(args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ZealWarning)
            params = Zeal(
                lower=args.lower,
                upper=args.upper,
                epsilon=args.epsilon,
                payload_bits=args.payload_bits,
                exponent=args.exponent,
                sampler=args.sampler,
                grid_points=args.grid_points,
            )
        report = params.audit(max_outputs=args.max_outputs)
        memo = None if args.grid_points is None else audit_memo(params, times=args.times)
    except ZealError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report)
    if memo is not None:
        print(memo)
    return 0 if report.within_budget() and (memo is None or memo.holds) else 1


if __name__ == "__main__":
    sys.exit(main())
