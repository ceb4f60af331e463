"""The one builder of new leases, and their inserts.

`lease_row` makes a new lease (reserved) and its `reserved` event as plain columns over the
columns every lease of one write shares (`Shared`: pool, who, when, until when). The ledger
(`ledger.apply`) inserts them, only once their capacity is taken: a few in the node UPDATE's
own statement (`fused_insert`), a scheduling pass's thousands by COPY (`copy_insert`), and
through the ORM on the portable path (`orm_insert`).
"""

from __future__ import annotations

from operator import itemgetter

import orjson
from django.db import connection
from django.db.models import JSONField

from leases import snapshot as snap
from leases.choices import LeaseState
from leases.models import Lease, LeaseEvent, new_fencing_token
from leases.node_views import mig_mask
from placement import types as core
from pools.actors import Actor
from pools.reasons import Reason


def _values(instance, leave_out) -> dict:
    # attname → value of an unsaved instance's concrete columns (the model's defaults included)
    fields = type(instance)._meta.concrete_fields
    return {
        f.attname: getattr(instance, f.attname)
        for f in fields
        if not f.primary_key and f.attname not in leave_out
    }


def _instance(model, values: dict):
    """An instance of every concrete column's value (attname → value), by the positional path
    of Model.__init__ that `from_db` takes: a fifth of the keyword path's cost."""
    return model(*[values[f.attname] for f in model._meta.concrete_fields])


class Shared:
    """What every lease of one write shares: the columns of its leases and their events that
    no row sets itself (the model's defaults included), built once per write."""

    __slots__ = ("event", "event_values", "lease_values", "pool")

    def __init__(self, *, pool, actor: Actor, now, expires_at):
        self.pool = pool
        fields = Lease._meta.concrete_fields
        self.lease_values = {
            **{f.attname: f.get_default() for f in fields if f.attname not in _OWN_LEASE_COLUMNS},
            "pool_id": pool.pk,
            "state": LeaseState.RESERVED,
            "state_changed_at": now,
            "expires_at": expires_at,
            "created_by_id": actor.user_id,
            "created_at": now,
        }
        del self.lease_values["id"]
        self.event = LeaseEvent.build(
            None, actor=actor, from_state="", to_state=LeaseState.RESERVED,
            reason=Reason.RESERVED, at=now,
        )  # fmt: skip
        self.event_values = _values(self.event, ("lease_id", "message", "data"))

    def base_lease(self) -> Lease:
        """An unsaved lease of these columns (its own columns empty: each row gives them)."""
        return _instance(
            Lease, {**dict.fromkeys(_OWN_LEASE_COLUMNS), **self.lease_values, "id": None}
        )


# the columns each row sets itself (`lease_row`); every other column comes from `Shared`
_OWN_LEASE_COLUMNS = (
    "tenant_id", "node_id", "job_id", "cpu_millicores", "memory_mib", "scratch_mib",
    "gpu_allocations", "request", "placement", "policy_version", "idempotency_key",
    "idempotency_digest", "fencing_token", "window_start", "window_end", "tolerance_s",
    "backfill_of_id",
)  # fmt: skip


class Row:
    """One new lease and its event (column → value over `shared`), and what the ledger needs
    to know of it: `group`, rows taken all or none (a gang: any hashable, None alone);
    `key`, the caller's own handle. `lease_id` is set once inserted."""

    __slots__ = ("event", "group", "key", "lease", "lease_id", "shared")

    def __init__(self, shared: Shared, lease: dict, event: dict, key=None, group=None):
        self.shared, self.lease, self.event = shared, lease, event
        self.key, self.group = key, group
        self.lease_id: int | None = None

    @property
    def node_id(self) -> int:
        return self.lease["node_id"]

    @property
    def tenant_id(self) -> int:
        return self.lease["tenant_id"]

    @property
    def holds(self) -> bool:
        """Whether it takes capacity on the ledger (a backfill borrows its reservation's)."""
        return self.lease["backfill_of_id"] is None

    def instance(self, **related) -> Lease:
        """The lease as a model instance (saved once `lease_id` is set), with its pool and the
        `related` objects it names (tenant=, job=, ...) at hand."""
        lease = _instance(Lease, {**self.shared.lease_values, **self.lease, "id": self.lease_id})
        lease.pool = self.shared.pool
        for name, value in related.items():
            setattr(lease, name, value)
        if self.lease_id is not None:
            lease._state.adding = False
            lease._state.db = "default"
        return lease


def placement_record(placement: core.Placement, decision: dict | None = None) -> dict:
    record = {
        "node": placement.node,
        "score": placement.score,
        "score_breakdown": dict(placement.score_breakdown),
        "grants": {
            k: {"minimum": g.minimum, "preferred": g.preferred, "granted": g.granted}
            for k, g in placement.grants.items()
        },
        # each preference granted less than asked, and by how much (0 when none was asked)
        "degraded": {
            k: g.preferred - g.granted
            for k, g in placement.grants.items()
            if g.granted < g.preferred
        },
        "policy": placement.policy_name,
        # the NUMA node CPU and memory come from when the request pinned one: the agent's cpuset
        "numa_node": placement.numa_node,
    }
    if placement.data_arrival_s is not None:
        # the data the job needs there (image, inputs): what the node's caches held, what
        # still moves and when it is estimated to have arrived (docs/storage.md)
        record["data_avoided_bytes"] = placement.data_avoided_bytes
        record["data_moved_bytes"] = placement.data_moved_bytes
        record["data_arrival_s"] = placement.data_arrival_s
    if decision is not None:  # how the scheduling pass chose (placement.batch)
        record["decision"] = decision
    return record


def lease_row(
    shared: Shared, *, tenant_id, request, placement, node_id, allocations, job_id=None,
    idempotency_key="", digest="", window=None, backfill_of: Lease | None = None,
    decision: dict | None = None, attempts: int = 1, key=None, group=None,
) -> Row:  # fmt: skip
    """The new lease of `placement` (reserved) and its `reserved` event. `digest`: the keyed
    request's `request_digest` ("" without a key); `decision`: the pass's decision record,
    kept in the lease's placement; `backfill_of`: the reservation a backfill runs inside."""
    record = {**placement_record(placement, decision), "attempts": attempts}
    message = f"reserved on {placement.node}"
    data = {"node": placement.node, "score": placement.score}
    if window:
        message += f" for the window from {window.start:%Y-%m-%d %H:%M}"
    if backfill_of is not None:
        record["backfill_of"] = data["backfill_of"] = backfill_of.pk
        message = (
            f"backfilled into reservation {backfill_of.pk} on {placement.node}, "
            f"ends before {backfill_of.window_start:%Y-%m-%d %H:%M}"
        )
    lease = {
        "tenant_id": tenant_id,
        "node_id": node_id,
        "job_id": job_id,
        "cpu_millicores": placement.cpu_millicores,
        "memory_mib": placement.memory_mib,
        "scratch_mib": placement.scratch_mib,
        "gpu_allocations": allocations,
        "request": request,
        "placement": record,
        "policy_version": placement.policy_version,
        "idempotency_key": idempotency_key,
        "idempotency_digest": digest,
        "fencing_token": new_fencing_token(),
        "window_start": window.start if window else None,
        "window_end": window.end if window else None,
        "tolerance_s": int(window.tolerance.total_seconds()) if window else 0,
        "backfill_of_id": backfill_of.pk if backfill_of is not None else None,
    }
    return Row(shared, lease, {"message": message, "data": data}, key=key, group=group)


def gpu_allocations(
    placement: core.Placement, view: snap.Snapshot, node_id: int, node: core.NodeView | None = None
) -> list[dict]:
    """The lease's GPU rows, by GPU id; `node`: the placement's node view when the caller has
    it (finding it by name in the snapshot is a scan)."""
    node = node or view.node(placement.node)
    by_index = {g.index: g for g in node.gpus}
    out = []
    for share in placement.devices:
        gpu_id = view.gpu_ids[(node_id, share.index)]
        if share.mig_profile:
            g = by_index[share.index]
            mask = mig_mask(g.model, g.memory_mib, share.mig_profile, share.mig_start)
            out.append(
                {
                    "gpu": gpu_id,
                    "index": share.index,
                    "milli": 0,
                    "mig_slots": mask,
                    "mig_profile": share.mig_profile,
                }
            )
        else:
            out.append({"gpu": gpu_id, "index": share.index, "milli": share.milli, "mig_slots": 0})
    return sorted(out, key=lambda a: a["gpu"])


# --- inserts ---------------------------------------------------------------------------------


def _insert_fields(model, *, without: str = "") -> list:
    """A model's concrete fields for an INSERT: no primary key (and not `without`)."""
    return [f for f in model._meta.concrete_fields if not f.primary_key and f.attname != without]


_FUSED: list[str] = []


def fused_insert(node_update: str, rows: list[Row]) -> tuple[str, dict]:
    """One statement: the node UPDATE (`node_update`, returning the ids of the nodes that took
    their part), then the leases of `rows` on those nodes (and those that hold nothing) and
    their events. Returns (statement, its `rows` parameter); the statement returns (position in
    `rows` + 1, lease id) of each lease it inserted.

    The rows travel as ONE json parameter and json_populate_record types each column from the
    table itself, so the statement text is the same for every batch (psycopg and PostgreSQL
    parse it once) and no per-value quoting happens in Python."""
    if not _FUSED:
        q = connection.ops.quote_name
        lease_cols = [q(f.column) for f in _insert_fields(Lease)]
        event_cols = [q(f.column) for f in _insert_fields(LeaseEvent, without="lease_id")]
        lease_t, event_t = Lease._meta.db_table, LeaseEvent._meta.db_table
        _FUSED.append(
            f"src AS MATERIALIZED (SELECT nextval(pg_get_serial_sequence('{lease_t}', 'id')) "
            "AS id, d.o, d.doc FROM json_array_elements(CAST(%(rows)s AS json)) "
            "WITH ORDINALITY AS d(doc, o) WHERE d.doc ->> 'n' IS NULL "
            "OR CAST(d.doc ->> 'n' AS bigint) IN (SELECT id FROM taken)), "
            f"ins AS (INSERT INTO {lease_t} (id, {', '.join(lease_cols)}) "
            f"SELECT src.id, {', '.join('r.' + c for c in lease_cols)} FROM src, "
            f"json_populate_record(NULL::{lease_t}, src.doc -> 'l') AS r), "
            f"ev AS (INSERT INTO {event_t} ({', '.join(event_cols)}, {q('lease_id')}) "
            f"SELECT {', '.join('r.' + c for c in event_cols)}, src.id FROM src, "
            f"json_populate_record(NULL::{event_t}, src.doc -> 'e') AS r) "
            "SELECT o, id FROM src ORDER BY o"
        )
    docs = [
        {
            "n": row.node_id if row.holds else None,
            "l": {**row.shared.lease_values, **row.lease},
            "e": {**row.shared.event_values, **row.event},
        }
        for row in rows
    ]
    # orjson writes datetimes as RFC 3339 with their microseconds (DjangoJSONEncoder would
    # cut them to milliseconds) and is ~5x faster than json.dumps here
    return f"WITH taken AS ({node_update}), {_FUSED[0]}", {"rows": orjson.dumps(docs).decode()}


def copy_insert(rows: list[Row]) -> None:
    """Leases and their events by COPY, their ids drawn from the sequence first (a scheduling
    pass's thousands: COPY costs about half of the JSON insert of the same rows)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT nextval(pg_get_serial_sequence('{Lease._meta.db_table}', 'id')) "
            "FROM generate_series(1, %(n)s)",
            {"n": len(rows)},
        )
        ids = [row[0] for row in cursor.fetchall()]
    for row, pk in zip(rows, ids, strict=True):
        row.lease_id = pk
    for shared in {id(row.shared): row.shared for row in rows}.values():
        mine = [row for row in rows if row.shared is shared]
        leases = [row.lease for row in mine]
        copy_rows(shared.base_lease(), leases, ids=[row.lease_id for row in mine])
        copy_rows(shared.event, [{**row.event, "lease_id": row.lease_id} for row in mine])


def orm_insert(rows: list[Row]) -> None:
    """The same through the ORM (the portable path)."""
    leases = Lease.objects.bulk_create([row.instance() for row in rows])
    for row, lease in zip(rows, leases, strict=True):
        row.lease_id = lease.pk
    LeaseEvent.objects.bulk_create(
        LeaseEvent(**row.shared.event_values, **row.event, lease_id=row.lease_id) for row in rows
    )


def copy_rows(base, rows: list[dict], *, ids: list[int] | None = None) -> None:
    """Rows of `base`'s table in one COPY: each row (column → value, the same columns in every
    row) completed by the unsaved instance `base` for the columns it leaves out; `ids`: their
    primary keys (else the table's default). COPY costs about half of an INSERT of the same
    rows as a json parameter (19,621 leases: 0.7 s against 1.3 s) and a tenth of bulk_create's
    per-row Python."""
    if not rows:
        return
    model = type(base)
    q = connection.ops.quote_name
    given = list(rows[0])
    fields = {f.column: f for f in model._meta.concrete_fields if not f.primary_key}
    rest = [f for column, f in fields.items() if column not in rows[0]]
    tail = [_copy_value(getattr(base, f.attname), f) for f in rest]  # the same in every row
    json = [isinstance(fields[column], JSONField) for column in given]
    values_of = itemgetter(*given)
    columns = [*([model._meta.pk.column] if ids is not None else []), *given]
    columns += [f.column for f in rest]
    sql = f"COPY {model._meta.db_table} ({', '.join(map(q, columns))}) FROM STDIN"
    with connection.cursor() as cursor, cursor.copy(sql) as copy:
        for n, row in enumerate(rows):
            if row.keys() != rows[0].keys():
                raise ValueError(f"row {n} has other columns than the first: {sorted(row)}")
            values = values_of(row) if len(given) > 1 else (values_of(row),)
            values = [
                orjson.dumps(v).decode() if j else v for v, j in zip(values, json, strict=True)
            ]
            copy.write_row([ids[n], *values, *tail] if ids is not None else [*values, *tail])


def _copy_value(value, field):
    # a JSON column's value as JSON text; psycopg writes the others
    return orjson.dumps(value).decode() if isinstance(field, JSONField) else value
