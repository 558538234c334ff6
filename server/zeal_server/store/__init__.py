"""The store: every table and every statement on it (SQLAlchemy; SQLite or PostgreSQL),
and nothing of MQTT, NATS or HTTP.

This namespace holds every function the API, the broker and the CLI call (``from
zeal_server import store``): streams (``store.streams``), devices (``store.fleet``), sums
over time buckets (``store.sums``), compaction and verify (``store.compaction``), export
(``store.export``), retention (``store.retention``), the footprint and efficiency figures
(``store.footprint``, ``store.efficiency``) and the implausible devices
(``store.influence``). Those layers import a module of the store only for its tables
(``store.models``) or the engine (``store.db``); ingest, which decides what is written,
also uses the parts of the write path (``writes``, ``rawsql``, ``sequences``). The caller owns
the session and the transaction; no function here commits.
"""

from __future__ import annotations

from zeal_server.errors import StoreError
from zeal_server.store.bindings import (
    DEVICE_NAMES,
    MAX_F_PORT,
    Binding,
    bind,
    binding_map,
    check_binding,
    list_bindings,
    unbind,
)
from zeal_server.store.compaction import compact, verify
from zeal_server.store.efficiency import stream_efficiency
from zeal_server.store.export import (
    estimates_note,
    export_chunks,
    export_lines,
    segment_columns,
)
from zeal_server.store.fleet import (
    MAX_TAG_KEY,
    MAX_TAG_VALUE,
    MAX_TAGS,
    StreamTotals,
    check_tags,
    count_devices,
    device_by_name,
    device_page,
    devices_of,
    enroll,
    group_devices,
    groups,
    hours_at_cap,
    last_seen_per_device,
    readings_on_day,
    set_tags,
    stream_totals,
    streams_at_a_glance,
)
from zeal_server.store.footprint import segment_totals, sequence_state_bytes, stream_bytes
from zeal_server.store.influence import ALL_TIME, implausible, without_implausible
from zeal_server.store.retention import delete_device_data, housekeep
from zeal_server.store.signing import Signer, signer
from zeal_server.store.streams import (
    MAX_SERVER_BITS,
    check_retention,
    check_unit,
    config_of,
    create_stream,
    delete_stream,
    derive_params,
    device_rejects,
    installation_id,
    list_streams,
    name_problem,
    now_ms,
    params_of,
    rejects,
    release_stream,
    set_policy,
    set_retention,
    stream_by_name,
    tombstone_of,
)
from zeal_server.store.sums import (
    Devices,
    DeviceSums,
    Sums,
    bucket_bounds,
    closed_window,
    device_sums,
    estimate,
    from_limbs,
    series_sums,
    to_limbs,
    window_ms,
    window_sums,
)

__all__ = [
    "ALL_TIME",
    "DEVICE_NAMES",
    "MAX_F_PORT",
    "MAX_SERVER_BITS",
    "MAX_TAGS",
    "MAX_TAG_KEY",
    "MAX_TAG_VALUE",
    "Binding",
    "DeviceSums",
    "Devices",
    "Signer",
    "StoreError",
    "StreamTotals",
    "Sums",
    "bind",
    "binding_map",
    "bucket_bounds",
    "check_binding",
    "check_retention",
    "check_tags",
    "check_unit",
    "closed_window",
    "compact",
    "config_of",
    "count_devices",
    "create_stream",
    "delete_device_data",
    "delete_stream",
    "derive_params",
    "device_by_name",
    "device_page",
    "device_rejects",
    "device_sums",
    "devices_of",
    "enroll",
    "estimate",
    "estimates_note",
    "export_chunks",
    "export_lines",
    "from_limbs",
    "group_devices",
    "groups",
    "hours_at_cap",
    "housekeep",
    "implausible",
    "installation_id",
    "last_seen_per_device",
    "list_bindings",
    "list_streams",
    "name_problem",
    "now_ms",
    "params_of",
    "readings_on_day",
    "rejects",
    "release_stream",
    "segment_columns",
    "segment_totals",
    "sequence_state_bytes",
    "series_sums",
    "set_policy",
    "set_retention",
    "set_tags",
    "signer",
    "stream_by_name",
    "stream_bytes",
    "stream_efficiency",
    "stream_totals",
    "streams_at_a_glance",
    "to_limbs",
    "tombstone_of",
    "unbind",
    "verify",
    "window_ms",
    "window_sums",
    "without_implausible",
]
