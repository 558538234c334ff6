"""What /stats calls the database all in is what the database grew by (SQLite and
PostgreSQL): the empty schema counts as nothing, and a stream's figure equals the growth
over the empty schema that bench/store_footprint.py measures, after a VACUUM."""

from __future__ import annotations

import numpy as np
from sqlalchemy.orm import Session

from tests.server.helpers import PARAMS, RAISED_POLICY
from tools.testbed.databases import table_bytes, vacuum
from zeal import encode_batch
from zeal_server import store
from zeal_server.ingest import Ingest
from zeal_server.store.db import make_engine, migrate
from zeal_server.store.footprint import database_bytes, stream_bytes

T0 = 1_767_225_600_000


def test_the_all_in_figure_is_the_growth_over_the_empty_schema(database_url: str) -> None:
    """Empty: every table counts 0. With two streams of 20 devices, the streams' shares add
    up to the database's growth (within 1 %), and the stream with ten times the readings
    gets the larger share."""
    engine = make_engine(database_url)
    migrate(engine)
    vacuum(engine)
    empty = table_bytes(engine)
    with Session(engine) as session:
        assert all(v == 0 for v in database_bytes(session).values()), database_bytes(session)
    rng = np.random.default_rng(5)
    with Session(engine) as session, session.begin():
        for name, batches in (("big", 40), ("small", 4)):
            store.create_stream(
                session,
                name=name,
                lower=0,
                upper=110,
                epsilon=1,
                payload_bits=6,
                max_epsilon_per_day=RAISED_POLICY,
            )
            ingest = Ingest()
            for d in range(20):
                for s in range(batches):
                    codes = PARAMS.perturb(rng.uniform(0, 110, 60), rng=rng)
                    payload = encode_batch(
                        PARAMS,
                        stream=name,
                        device=f"d{d}",
                        sequence=s,
                        codes=codes,
                        timestamps=T0 + s * 60_000 + d * 100 + 1000 * np.arange(60),
                    )
                    topic = f"zeal/v1/{name}/d{d}/up"
                    assert ingest.add(session, topic, payload, T0).status == "stored"
        for stream in store.list_streams(session):
            store.compact(session, stream)
    vacuum(engine)
    grown = sum(size - empty.get(table, 0) for table, size in table_bytes(engine).items())
    with Session(engine) as session:
        shares = {
            s.name: sum(stream_bytes(session, s).values()) for s in store.list_streams(session)
        }
    assert abs(sum(shares.values()) - grown) <= 0.01 * grown, (shares, grown)
    assert shares["big"] > shares["small"] > 0
    engine.dispose()
