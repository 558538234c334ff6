"""Bytes on the air and airtime per reading on LoRaWAN: Zeal's LoRaWAN profile against
CayenneLPP (encoded by pycayennelpp) and against Zeal's MQTT payload (wire v2).

Readings 600 s apart, 1, 5, 10 and 60 of them per uplink. CayenneLPP gets each reading
as a temperature (0.1 degC resolution, 2 bytes) or an analog input (0.01 resolution,
2 bytes) on its own channel, and carries no time: the most favourable framing for it (with
a Unix time per reading it would take 6 bytes more each). Airtime is the Semtech formula
(SX1276 datasheet, section 4.1.1.7) at 125 kHz, coding rate 4/5, an 8-symbol preamble,
explicit header and CRC, low data rate optimization at SF11 and SF12, for the PHYPayload:
13 bytes of LoRaWAN framing (MHDR, FHDR without FOpts, FPort, MIC) plus the FRMPayload.

    python bench/lorawan.py [--markdown bench/LORAWAN.md]

Writes the tables (bench/REPORT.md embeds them) and prints them.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import numpy as np
from cayennelpp import LppFrame

from zeal import Zeal, encode_batch
from zeal.lorawan import encode_lorawan

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COUNTS = (1, 5, 10, 60)
WIDTHS = (3, 4, 5, 6, 7, 8)
SPACING = 600
#: MHDR (1), FHDR without FOpts (DevAddr 4, FCtrl 1, FCnt 2), FPort (1), MIC (4).
LORAWAN_FRAMING = 13
#: The largest FRMPayload at each spreading factor's EU868 data rate (125 kHz).
EU868_LIMIT = {7: 222, 12: 51}


def airtime_ms(phy_bytes: int, sf: int, bandwidth_hz: int = 125_000) -> float:
    """Time on air of a LoRa frame of `phy_bytes` (Semtech's formula; CR 4/5, CRC on,
    explicit header, 8 preamble symbols, low data rate optimization at SF >= 11)."""
    symbol = (1 << sf) / bandwidth_hz
    low_rate = 1 if sf >= 11 and bandwidth_hz == 125_000 else 0
    coding_rate = 1  # 4/5
    numerator = 8 * phy_bytes - 4 * sf + 28 + 16
    symbols = 8 + max(math.ceil(numerator / (4 * (sf - 2 * low_rate))) * (coding_rate + 4), 0)
    return ((8 + 4.25) + symbols) * symbol * 1000


def readings(count: int) -> np.ndarray:
    """Real readings for the CayenneLPP frames (their values do not change its size)."""
    with (ROOT / "data" / "seattle-temps.csv").open(newline="") as handle:
        rows = [
            float(row["temp"]) for _, row in zip(range(count), csv.DictReader(handle), strict=False)
        ]
    return (np.array(rows) - 32) / 1.8  # degF to degC


def zeal_stream(bits: int) -> Zeal:
    """A stream on -40 .. 60 degC at epsilon 1 with `bits`-bit codes."""
    return Zeal(lower=-40, upper=60, epsilon=1, payload_bits=bits)


def zeal_lorawan(bits: int, count: int) -> int:
    params = zeal_stream(bits)
    codes = np.full(count, params.code_min)
    frame = encode_lorawan(params, stream="temps", device="dev1", codes=codes,
                           spacing_seconds=SPACING)  # fmt: skip
    return len(frame)


def zeal_mqtt(bits: int, count: int) -> int:
    """Wire v2 as the MQTT agent sends it: sequence 5000, periodic timestamps."""
    params = zeal_stream(bits)
    stamps = 1_767_225_600_000 + SPACING * 1000 * np.arange(count)
    payload = encode_batch(params, stream="temps", device="dev1", sequence=5000,
                           timestamps=stamps, codes=np.full(count, params.code_min))  # fmt: skip
    return len(payload)


def cayenne(count: int, kind: str) -> int:
    frame = LppFrame()
    for channel, value in enumerate(readings(count)):
        if kind == "temperature":
            frame.add_temperature(channel, round(float(value), 1))
        else:
            frame.add_analog_input(channel, round(float(value), 2))
    return len(bytes(frame))


def tables() -> list[str]:
    lines = [
        "# LoRaWAN: bytes on the air and airtime per reading",
        "",
        f"Written by `python bench/lorawan.py`: readings {SPACING} s apart; CayenneLPP "
        "encoded by `pycayennelpp` (a temperature at 0.1 resolution, or an analog input, "
        "each on its own channel, with no time); Zeal MQTT is the wire-v2 payload the agent "
        "publishes (sequence 5000, periodic timestamps). Airtime: the Semtech formula at "
        f"125 kHz, CR 4/5, with {LORAWAN_FRAMING} bytes of LoRaWAN framing per uplink.",
        "",
        "## FRMPayload bytes per reading",
        "",
        "| readings per uplink | "
        + " | ".join(f"Zeal LoRaWAN {k} bits" for k in WIDTHS)
        + " | CayenneLPP temperature | CayenneLPP analog | Zeal MQTT 6 bits |",
        "|---|" + "---|" * (len(WIDTHS) + 3),
    ]
    for n in COUNTS:
        zeal = [zeal_lorawan(k, n) / n for k in WIDTHS]
        others = [cayenne(n, "temperature") / n, cayenne(n, "analog") / n, zeal_mqtt(6, n) / n]
        lines.append(f"| {n} | " + " | ".join(f"{x:.2f}" for x in [*zeal, *others]) + " |")
    lines += [
        "",
        "## Against CayenneLPP's temperature, bytes per reading",
        "",
        "| readings per uplink | " + " | ".join(f"{k} bits" for k in WIDTHS) + " |",
        "|---|" + "---|" * len(WIDTHS),
    ]
    for n in COUNTS:
        lpp = cayenne(n, "temperature")
        lines.append(
            f"| {n} | " + " | ".join(f"{zeal_lorawan(k, n) / lpp:.3f}" for k in WIDTHS) + " |"
        )
    lines += [
        "",
        "## Airtime per reading, ms",
        "",
        "A frame over the largest FRMPayload of the spreading factor's EU868 data rate "
        f"({EU868_LIMIT[7]} bytes at SF7, {EU868_LIMIT[12]} at SF12) cannot be sent: `–`.",
        "",
        "| readings per uplink | SF | Zeal LoRaWAN 3 bits | Zeal LoRaWAN 6 bits | "
        "Zeal LoRaWAN 8 bits | CayenneLPP temperature | Zeal MQTT 6 bits |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in COUNTS:
        for sf in (7, 12):
            sizes = [zeal_lorawan(3, n), zeal_lorawan(6, n), zeal_lorawan(8, n)]
            sizes += [cayenne(n, "temperature"), zeal_mqtt(6, n)]
            cells = [
                f"{airtime_ms(LORAWAN_FRAMING + size, sf) / n:.1f}"
                if size <= EU868_LIMIT[sf]
                else "–"
                for size in sizes
            ]
            lines.append(f"| {n} | {sf} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", type=Path, default=HERE / "LORAWAN.md")
    args = parser.parse_args(argv)
    text = "\n".join(tables()) + "\n"
    args.markdown.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
