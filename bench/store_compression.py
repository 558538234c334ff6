"""Store compression against the paper's baselines (python bench/store_compression.py).

Readings are privatized, sent through the real ingest path into a real (SQLite) store and
compacted; the sizes of the chunks' sections (codes, timestamps, devices) are compared with:

* the empirical entropy of the codes (the limit for coding codes one by one);
* zstandard level 3 on plain piecewise-mechanism float64 outputs with Abar = 0 (the paper's
  starting point: the same mechanism, no addition transform, float64 storage);
* zstandard level 3 on the privatized float64 values x* = x + Abar (how the paper stores them).

Every figure is in bits per reading; CR (paper Eq. (34)) is compressed bits / 64.
"""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

import numpy as np
import numpy.typing as npt
import zstandard
from sqlalchemy import select
from sqlalchemy.orm import Session

from zeal import Zeal, encode_batch
from zeal.baselines import PiecewiseFloat
from zeal.mqtt.topics import data_topic
from zeal_server import store
from zeal_server.ingest import Ingest
from zeal_server.store.db import make_engine, migrate, session_factory
from zeal_server.store.models import Segment, Stream
from zeal_server.store.segments import CHUNK, section_sizes

__all__ = ["empirical_entropy", "measure"]

DATA = Path(__file__).resolve().parents[1] / "data" / "seattle-temps.csv"


def empirical_entropy(codes: npt.NDArray[np.uint64]) -> float:
    """Bits per code of the codes' empirical distribution."""
    _, counts = np.unique(codes, return_counts=True)
    p = counts / codes.size
    return float(-(p * np.log2(p)).sum())


def section_bytes(session: Session, stream: Stream) -> dict[str, int]:
    """Bytes of the stream's compacted segment rows by column: codes, timestamps (run
    starts, least steps, steps) and devices (run ids and lengths); headers count as
    timestamps."""
    sizes = {"codes": 0, "timestamps": 0, "devices": 0}
    for data in session.scalars(
        select(Segment.data).where(Segment.stream_id == stream.id, Segment.encoding == CHUNK)
    ):
        header, ids, lengths, starts, least, steps, codes = section_sizes(data)
        sizes["codes"] += codes + 5
        sizes["timestamps"] += header + starts + least + steps + 20
        sizes["devices"] += ids + lengths + 10
    return sizes


def measure(
    *,
    readings: int = 105_120,
    devices: int = 20,
    payload_bits: int = 6,
    dataset: Path = DATA,
    seed: int = 1,
) -> dict[str, float]:
    """Ingest `readings` Seattle temperatures (batches of 60, one per minute per device)."""
    with dataset.open(newline="") as handle:
        data = np.array([float(r["temp"]) for r in csv.DictReader(handle)])
    values = np.resize(data, readings)
    params = Zeal(lower=0, upper=110, epsilon=1, payload_bits=payload_bits, max_epsilon_per_day=1e6)
    rng = np.random.default_rng(seed)
    codes = params.perturb(values, rng=rng)
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{tmp}/zeal.sqlite")
        migrate(engine)
        sessions = session_factory(engine)
        ingest = Ingest()
        t0 = 1767225600000
        per_device = readings // devices
        with sessions() as session, session.begin():
            stream = store.create_stream(
                session,
                name="temps",
                lower=0,
                upper=110,
                epsilon=1,
                payload_bits=payload_bits,
                bucket_seconds=3600,
                max_epsilon_per_day=1e6,
            )
            messages = []
            for d in range(devices):
                own = codes[d * per_device : (d + 1) * per_device]
                for seq, start in enumerate(range(0, own.size, 60)):
                    part = own[start : start + 60]
                    payload = encode_batch(
                        params,
                        stream="temps",
                        device=f"dev{d:03d}",
                        sequence=seq,
                        codes=part,
                        timestamps=t0 + 1000 * (start + np.arange(part.size)),
                    )
                    messages.append((data_topic("temps", f"dev{d:03d}"), payload, t0))
            ingest.add_many(session, messages)
            store.compact(session, stream)
            sizes = section_bytes(session, stream)
            assert not store.verify(session, stream)
        engine.dispose()
    stored = per_device * devices
    stored_codes = codes[:stored]
    level3 = zstandard.ZstdCompressor(level=3)
    plain = PiecewiseFloat(0, 110, 1).perturb(values[:stored], rng=rng)
    pm_bits = 8 * len(level3.compress(plain.tobytes()))
    privatized_bits = 8 * len(level3.compress(params.to_float64(stored_codes).tobytes()))
    segment = sizes["codes"] + sizes["timestamps"] + sizes["devices"]
    return {
        "readings": stored,
        "payload_bits": payload_bits,
        "entropy": empirical_entropy(stored_codes),
        "codes": 8 * sizes["codes"] / stored,
        "timestamps": 8 * sizes["timestamps"] / stored,
        "devices": 8 * sizes["devices"] / stored,
        "segment": 8 * segment / stored,
        "pm_float64_zstd": pm_bits / stored,
        "privatized_float64_zstd": privatized_bits / stored,
    }


def main() -> None:
    m = measure()
    print(
        f"store compression, {m['readings']:,} Seattle readings at {m['payload_bits']} bits "
        "(bits per reading; CR = bits / 64)"
    )
    rows = [
        ("empirical entropy of the codes", m["entropy"]),
        ("codes section (zstd 19, one byte per code)", m["codes"]),
        ("timestamps (run starts and steps)", m["timestamps"]),
        ("devices (runs)", m["devices"]),
        ("whole chunk data", m["segment"]),
        ("plain PM float64, Abar = 0, zstd 3", m["pm_float64_zstd"]),
        ("privatized float64 x*, zstd 3", m["privatized_float64_zstd"]),
    ]
    for name, bits in rows:
        print(f"  {name:<44} {bits:8.3f}   CR {bits / 64:.4f}")
    print(
        f"codes / entropy {m['codes'] / m['entropy']:.4f} (<= 1.05); segment / entropy "
        f"{m['segment'] / m['entropy']:.4f} (<= 1.25); PM float64 / segment "
        f"{m['pm_float64_zstd'] / m['segment']:.2f}x (>= 8); codes <= privatized float64: "
        f"{m['codes'] <= m['privatized_float64_zstd']}"
    )


if __name__ == "__main__":
    main()
