"""What a stream holds: its figures (stats) and its readings as CSV (export)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import StreamingResponse

from zeal.policy import MICRO, day_of
from zeal_server import store
from zeal_server.api.costs import paced
from zeal_server.api.deps import (
    API,
    MAX_EXPORTS,
    READ,
    Db,
    End,
    Start,
    as_datetime,
    invalid,
    stream_or_404,
    window,
)
from zeal_server.api.schemas import EfficiencyOut, Problem, RejectsOut, SenderOut, StatsOut

__all__ = ["router"]

router = APIRouter()


@router.get(f"{API}/streams/{{name}}/rejects", dependencies=READ, response_model=RejectsOut)
def rejected(
    name: str,
    db: Db,
    limit: Annotated[int, Query(ge=1, le=1000, description="names shown [20]")] = 20,
) -> RejectsOut:
    """Who sent the stream's rejected messages: the `limit` names with the most (devices
    that never stored a reading too), each with its reasons and the time of its latest,
    and the others summed. A name that is not a stream yet (a device configured with a
    wrong stream) is asked under that name; a name no message ever used is a 404."""
    senders, others, messages = store.rejected_senders(db, name, limit)
    if not senders and store.stream_by_name(db, name) is None:
        stream_or_404(db, name)
    return RejectsOut(
        stream=name,
        senders=[
            SenderOut(
                device=s.device,
                messages=s.messages,
                last=as_datetime(s.last_ms),
                reasons=s.reasons,
                known=s.known,
            )
            for s in senders
        ],
        other_senders=others,
        other_messages=messages,
    )


@router.get(f"{API}/streams/{{name}}/stats", dependencies=READ, response_model=StatsOut)
def stats(
    name: str,
    db: Db,
    efficiency_figures: Annotated[
        bool,
        Query(
            alias="efficiency",
            description="measure the efficiency figures (decodes a sample; false skips it)",
        ),
    ] = True,
) -> StatsOut:
    """Readings, messages, bytes on the wire and in the store, rejects by reason."""
    stream = stream_or_404(db, name)
    totals = store.stream_totals(db, stream)
    readings, received = totals.readings, totals.received_bytes
    measured = (
        store.stream_efficiency(db, stream, readings=readings, received_bytes=received)
        if efficiency_figures
        else None
    )
    stored, segment_bytes = store.segment_totals(db, stream)
    tables = store.stream_bytes(db, stream)
    # at least what its segments hold: a small stream may still fit in the pages its tables
    # keep empty, where the page count says nothing yet (store.efficiency does the same)
    database = max(sum(tables.values()), segment_bytes)
    spread = _spread(store.stream_accounts(db, stream.id, day_of(store.now_ms())))
    return StatsOut(
        stream=name,
        readings=readings,
        messages=totals.messages,
        devices=totals.devices,
        active_devices=totals.active_devices,
        last_seen=None if totals.last_seen_ms is None else as_datetime(totals.last_seen_ms),
        bytes_received=received,
        duplicates=totals.duplicates,
        sequence_resets=totals.sequence_resets,
        missing=totals.missing,
        late=totals.late,
        wire_bytes_per_reading=received / readings if readings else None,
        stored_readings=stored,
        store_bytes={
            "segments": segment_bytes,
            "database": database,
            "sequence_state": store.sequence_state_bytes(db, stream),
        },
        store_bits_per_reading=(
            {"segments": 8 * segment_bytes / stored, "database": 8 * database / stored}
            if stored
            else None
        ),
        database_bytes=tables,
        rejects=store.rejects(db, name),
        efficiency=None if measured is None else EfficiencyOut(**measured),
        device_accounts=spread,
    )


def _spread(accounts: list[tuple[int, ...]]) -> dict[str, dict[str, float]]:
    """Median, 90th percentile (linear, numpy's default) and max of each account column
    over the stream's devices, in epsilon."""
    if not accounts:
        return {}
    table = np.array(accounts, dtype=np.float64) / MICRO
    return {
        column: {
            "median": float(np.median(table[:, i])),
            "p90": float(np.percentile(table[:, i], 90)),
            "max": float(table[:, i].max()),
        }
        for i, (column, _) in enumerate(store.ACCOUNT_COLUMNS)
    }


#: The media type of a Parquet export (IANA, 2024).
PARQUET = "application/vnd.apache.parquet"


@router.get(
    f"{API}/streams/{{name}}/export",
    dependencies=READ,
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/csv": {}, PARQUET: {}},
            "description": "CSV rows (time or timestamp_ms, device, code, estimate), or a "
            "Parquet file with the same columns and the stream's configuration",
            "headers": {
                "Zeal-Estimates": {
                    "description": "why values outside the stream's range are expected",
                    "schema": {"type": "string"},
                }
            },
        },
        429: {"model": Problem, "description": f"{MAX_EXPORTS} exports already running"},
    },
)
def export(
    name: str,
    request: Request,
    start: Start = None,
    end: End = None,
    times: Annotated[
        Literal["iso", "epoch"],
        Query(description="CSV times: ISO 8601 in UTC (time) or epoch ms (timestamp_ms)"),
    ] = "iso",
    kind: Annotated[
        Literal["csv", "parquet"],
        Query(
            alias="format",
            description="csv, or parquet (columns time, device, code, estimate; the stream's "
            "signed configuration in the file's metadata, zeal.config; needs pyarrow on the "
            "server)",
        ),
    ] = "csv",
) -> StreamingResponse:
    """Every stored reading: its time, device, code (the privatized value it sent) and the
    estimate its code decodes to with the stream's parameters (GET .../config:
    ``params_from_config(config).decode(code)`` gives the estimate exactly, so anyone can
    check the server's averages). Each estimate is one privatized reading: unbiased but
    noisy, so values outside the stream's range are expected (the Zeal-Estimates header
    says so too). Streamed in chunks, each read in a short database session of its own, and
    made at most half the time (the rest is left to ingestion and other reads); at most
    MAX_EXPORTS run at once."""
    with request.app.state.sessions() as db:
        stream = stream_or_404(db, name)
        first, stop = window(stream, start, end)
        config = store.config_of(db, stream) if kind == "parquet" else None
    if kind == "parquet" and (problem := store.parquet_problem()):
        raise invalid("query", "format", problem)
    slots: threading.BoundedSemaphore = request.app.state.exports
    if not slots.acquire(blocking=False):
        raise HTTPException(
            429,
            f"{MAX_EXPORTS} exports are running; try again shortly",
            headers={"Retry-After": "5"},
        )
    released = threading.Event()

    def release() -> None:
        if not released.is_set():
            released.set()
            slots.release()

    note = store.estimates_note(stream)

    def rows() -> Iterator[str | bytes]:
        try:
            chunks = store.export_chunks(request.app.state.sessions, stream, first, stop)
            if config is not None:
                yield from paced(store.parquet_chunks(chunks, config, note))
            else:
                yield from paced(store.csv_chunks(chunks, times))
        finally:
            release()

    body = rows()
    weakref.finalize(body, release)  # also when the client left before the first chunk
    headers = {"Zeal-Estimates": note}
    if config is not None:
        headers["Content-Disposition"] = f'attachment; filename="{stream.name}.parquet"'
        return StreamingResponse(body, media_type=PARQUET, headers=headers)
    return StreamingResponse(body, media_type="text/csv", headers=headers)
