"""One `zeal-edge simulate` process into the broker at ZEAL_MQTT_URL (default: local 1883).

Prints the readings per second the broker acknowledged (target: >= 20,000). 1,000 devices,
600 readings each, as fast as acknowledged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from zeal import Zeal
from zeal.streamconfig import config_document

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    broker = os.environ.get("ZEAL_MQTT_URL", "mqtt://127.0.0.1:1883")
    with tempfile.TemporaryDirectory() as tmp:
        params = Path(tmp) / "params.json"
        params.write_text(json.dumps(config_document("bench", Zeal(lower=0, upper=110, epsilon=1))))
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "zeal_edge",
                "simulate",
                "--devices",
                "1000",
                "--source",
                f"csv:{ROOT / 'data' / 'seattle-temps.csv'}",
                "--stream",
                "bench",
                "--broker",
                broker,
                "--params",
                str(params),
                "--rate",
                "0",
                "--readings",
                "600",
                "--data-dir",
                tmp,
                "--log-level",
                "WARNING",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    print(f"simulate into {broker}: {result.stdout.strip() or result.stderr.strip()}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
