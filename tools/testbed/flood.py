"""A device flooding garbage and oversized messages while a fleet sends: shared by the
functional test (test_reliability.py, in `make test`) and the timing benchmark
(bench/flood.py, in `make reliability`)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.testbed.broker import Mosquitto, fleet_command
from tools.testbed.server import Server, create_temps, wait_for

#: What the broker's ACL lets a hostile device reach: its own topic only.
FLOOD_TOPIC = "zeal/v1/temps/evil/up"
#: deploy/mosquitto's limit: packets over it are refused by the broker itself.
MAX_PACKET_SIZE = 131072
DEVICES, READINGS = 400, 1500
#: Messages the flooder sends in a flooded run at least: it floods until the fleet is
#: stored and, on a machine too busy to have sent these by then, until it has.
FLOOD_MESSAGES = 6000

FLOODER = rf"""
import os, signal, sys, time
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
port = int(sys.argv[1])
sent, least, stop = 0, int(sys.argv[2]), []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="evil", protocol=MQTTProtocolVersion.MQTTv5)
c.reconnect_delay_set(min_delay=0.05, max_delay=0.05)
c.connect("127.0.0.1", port)
c.loop_start()
big = os.urandom(256 * 1024)
print("flooding", flush=True)  # its SIGTERM handler is in place
while not (stop and sent >= least):
    payload = big if sent % 50 == 49 else os.urandom(40)
    # QoS 0, as fast as it can; the broker drops the connection for each oversized packet
    # and the flooder comes straight back.
    if c.publish("{FLOOD_TOPIC}", payload, qos=0).rc == 0:
        sent += 1
    else:
        time.sleep(0.01)  # why it sleeps: not connected (the broker dropped it); paho reconnects
print(sent, flush=True)
"""


@dataclass
class FloodTrial:
    """Seconds of each ingest run, with and without the flood, and what the flood did."""

    quiet: list[float] = field(default_factory=list)
    loud: list[float] = field(default_factory=list)
    flooded: int = 0  # messages the flooder published (handed to its client)
    flood_seconds: float = 0.0  # the flood's duration, summed over the flooded runs
    rejects: dict[str, int] = field(default_factory=dict)  # the stream's, by reason
    readings: int = 0  # the stream's readings at the end
    sent: int = 0  # readings the fleets sent (the flooder sends none that decode)

    @property
    def slowdown(self) -> float:
        """Median loud run over median quiet run, minus 1."""
        return statistics.median(self.loud) / statistics.median(self.quiet) - 1

    @property
    def decoded_rejects(self) -> int:
        """Rejects that cost a decode (all but those shed at the door)."""
        shed = self.rejects.get("rate_limited", 0) + self.rejects.get("too_large", 0)
        return sum(self.rejects.values()) - shed

    def summary(self) -> str:
        quiet = ", ".join(f"{s:.2f}" for s in self.quiet)
        loud = ", ".join(f"{s:.2f}" for s in self.loud)
        return (
            f"ingest of {DEVICES * READINGS:,} readings from {DEVICES} devices: median "
            f"{statistics.median(self.quiet):.2f} s quiet [{quiet}], "
            f"{statistics.median(self.loud):.2f} s during the flood [{loud}] "
            f"({self.slowdown:+.1%}); flood {self.flooded:,} messages over "
            f"{self.flood_seconds:.0f} s; rejects {self.rejects}; "
            f"readings stored {self.readings:,} of {self.sent:,} sent by the fleets"
        )


def limit_packet_size(broker: Mosquitto) -> None:
    """Restart `broker` with deploy/'s max_packet_size."""
    broker.stop()
    with broker.config.open("a") as conf:
        conf.write(f"max_packet_size {MAX_PACKET_SIZE}\n")
    broker.start()


def ingest_seconds(
    server: Server, broker: Mosquitto, tmp_path: Path, flood: bool
) -> tuple[float, int, float]:
    """Seconds for DEVICES x READINGS (as fast as acknowledged) to be committed, with or
    without a device flooding garbage and 256 KB messages on its own topic meanwhile; and the
    messages flooded, with the seconds the flood lasted (0 without one)."""
    before = server.stats()
    flooder = None
    flood_began = time.monotonic()
    if flood:
        flooder = subprocess.Popen(
            # nice: on this 2-core test machine the flooder would otherwise take a core from
            # the server; a real flooding device spends its own CPU, not the server's.
            [
                "nice",
                "-n",
                "19",
                sys.executable,
                "-c",
                FLOODER,
                str(broker.port),
                str(FLOOD_MESSAGES),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        # the flood is under way before the fleet starts (and a SIGTERM cannot cut it short)
        assert flooder.stdout is not None
        assert flooder.stdout.readline() == "flooding\n"
    began = time.monotonic()
    fleet = subprocess.Popen(
        fleet_command(
            broker.url,
            tmp_path / f"fleet-{flood}",
            *("--devices", str(DEVICES), "--rate", "0", "--readings", str(READINGS)),
            *("--log-level", "WARNING", "--device-prefix", tmp_path.name),  # new devices each run
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    messages = DEVICES * READINGS // 60
    target = {
        "messages": before["messages"] + messages,
        "readings": before["readings"] + DEVICES * READINGS,
    }
    got = wait_for(server, target, timeout=120)
    seconds = time.monotonic() - began
    fleet.communicate(timeout=60)
    flooded = 0
    if flooder is not None:
        flooder.terminate()  # it stops once it has sent FLOOD_MESSAGES
        out, _ = flooder.communicate(timeout=300)
        flooded = int(out.split()[-1]) if out.split() else 0
    assert got == target, f"stored {got}, expected {target}"
    return seconds, flooded, time.monotonic() - flood_began if flood else 0.0


def flood_trial(server: Server, broker: Mosquitto, tmp_path: Path, pairs: int) -> FloodTrial:
    """A warm-up run, then `pairs` quiet and flooded runs alternated (quiet first, then loud
    first, ...), so a drift of the shared machine hits both alike."""
    create_temps(server)
    ingest_seconds(server, broker, tmp_path / "warm", flood=False)  # warm caches and disk
    trial = FloodTrial()
    for run in range(pairs):
        for flood in (False, True) if run % 2 == 0 else (True, False):
            seconds, count, lasted = ingest_seconds(
                server, broker, tmp_path / f"{'loud' if flood else 'quiet'}{run}", flood
            )
            if flood:
                trial.loud.append(seconds)
                trial.flooded += count
                trial.flood_seconds += lasted
            else:
                trial.quiet.append(seconds)
    stats = server.http.get("/api/v1/streams/temps/stats").json()
    trial.rejects = stats["rejects"]
    trial.readings = stats["readings"]
    trial.sent = (1 + 2 * pairs) * DEVICES * READINGS
    return trial
