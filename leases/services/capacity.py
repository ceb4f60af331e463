"""The capacity guards, each stated once, and the only statements that take or return capacity.

A guard is a Django `Q` over the amounts to take. The portable path (SQLite, `make run`; see
`leases.backend`) filters each row with it through the ORM; on PostgreSQL one statement takes
every node's (or GPU's) part, and the same `Q` is rendered to SQL there, its amounts read
from a JSON recordset (`d.cpu`, `d.milli`, ...). So the guard of a single reserve and of a
pass of 20,000 jobs is one text:

    UPDATE node SET cpu_reserved = cpu_reserved + d.cpu ...
     WHERE id = d.node AND (state = 'ready' OR (state = 'draining' AND d.drain_exempt))
       AND reachability = 'reachable' AND cpu_reserved <= cpu_allocatable - d.cpu AND ...

(`d.drain_exempt`: every new lease on that node is drain-exempt, a volume's export.)

`take_nodes` is the one function that issues the guarded node UPDATE (optionally in one
statement with the inserts of the leases whose node took, `lease_rows.fused_insert`),
`take_gpus` the GPU one; `return_capacity` the guarded decrements; `adopt_capacity` moves a
backfill's part of a reservation that has just returned its capacity onto the backfill.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import orjson
from django.db import connection
from django.db.models import (
    BigIntegerField,
    BooleanField,
    Case,
    CharField,
    F,
    IntegerField,
    Q,
    Value,
    When,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.db.models.lookups import Exact
from django.db.models.sql import Query

from leases import backend
from leases.signals import capacity_returned
from nodes.choices import NodeState, Reachability
from nodes.models import GpuDevice, Node

from .lease_rows import fused_insert

MIG, WHOLE, SHARE = "mig", "whole", "share"  # how a lease holds a GPU
CLASH = "clash"  # parts one device cannot hold together (no plan makes them): it takes nothing


@dataclass(slots=True)
class NodePart:
    """What new leases take of one node."""

    node: int
    cpu: int = 0
    mem: int = 0
    scratch: int = 0
    # every one of them is drain-exempt (its request's `drain_exempt`: a volume's export), so
    # the node may be draining
    drain_exempt: bool = False


@dataclass(slots=True)
class GpuPart:
    """What new leases take of one GPU: a MIG slice mask, a whole device, or a share;
    `tenant`: the sharer, when tenants may not mix on the device (None: anyone may join)."""

    gpu: int
    node: int
    kind: str
    milli: int = 0
    mask: int = 0
    tenant: int | None = None


def parts(rows) -> tuple[dict[int, NodePart], dict[int, GpuPart]]:
    """What new leases (`lease_rows.Row`s) take of each node and each GPU, summed."""
    nodes: dict[int, NodePart] = {}
    gpus: dict[int, GpuPart] = {}
    for row in rows:
        lease = row.lease
        exempt = _drain_exempt(lease["request"])
        node = nodes.get(lease["node_id"])
        if node is None:
            node = nodes[lease["node_id"]] = NodePart(lease["node_id"], drain_exempt=exempt)
        elif not exempt:
            node.drain_exempt = False
        node.cpu += lease["cpu_millicores"]
        node.mem += lease["memory_mib"]
        node.scratch += lease["scratch_mib"]
        if not lease["gpu_allocations"]:
            continue
        mixing = row.shared.pool.allow_tenant_mixing_on_shared_gpus
        for alloc in lease["gpu_allocations"]:
            mask, milli = alloc["mig_slots"], alloc["milli"]
            kind = MIG if mask else WHOLE if milli >= 1000 else SHARE
            tenant = lease["tenant_id"] if kind == SHARE and not mixing else None
            part = gpus.get(alloc["gpu"])
            if part is None:
                gpus[alloc["gpu"]] = GpuPart(alloc["gpu"], node.node, kind, milli, mask, tenant)
                continue
            if kind != part.kind or kind == WHOLE or mask & part.mask or tenant != part.tenant:
                part.kind = CLASH
            part.milli += milli
            part.mask |= mask
    return nodes, gpus


def _drain_exempt(request) -> bool:
    # as leases.snapshot.core_request reads it: only the control plane puts it in a request
    return isinstance(request, dict) and request.get("drain_exempt") is True


# --- the guards ------------------------------------------------------------------------------


def node_guard(take) -> Q:
    """A node takes new leases only while ready — or draining, when every one of them is
    drain-exempt (`take.drain_exempt`: a volume's export) —, reachable and with room for all
    of them."""
    return Q(
        Q(state=NodeState.READY) | Q(Exact(take.drain_exempt, True), state=NodeState.DRAINING),
        reachability=Reachability.REACHABLE,
        cpu_millicores_reserved__lte=F("cpu_millicores_allocatable") - take.cpu,
        memory_mib_reserved__lte=F("memory_mib_allocatable") - take.mem,
        scratch_mib_reserved__lte=F("scratch_mib_allocatable") - take.scratch,
    )


def node_writes(take) -> dict:
    return {
        "cpu_millicores_reserved": F("cpu_millicores_reserved") + take.cpu,
        "memory_mib_reserved": F("memory_mib_reserved") + take.mem,
        "scratch_mib_reserved": F("scratch_mib_reserved") + take.scratch,
    }


def gpu_guards(take) -> dict[str, Q]:
    """What a healthy GPU must be, by the kind of part: a MIG slice, its memory slices free; a
    whole device, nothing on it; a share, room, and (tenants not mixing) nobody else's share."""
    tenant_ok = Q(share_tenant_id__isnull=True) | Q(
        share_tenant_id=Coalesce(take.tenant, F("share_tenant_id"))
    )
    return {
        MIG: Q(Exact(F("mig_slots_used").bitand(take.mask), 0), healthy=True, mig_enabled=True),
        WHOLE: Q(healthy=True, mig_enabled=False, mig_slots_used=0, milli_reserved=0),
        SHARE: Q(tenant_ok, healthy=True, mig_enabled=False, milli_reserved__lte=1000 - take.milli),
    }


def gpu_writes(take) -> dict:
    return {
        "milli_reserved": F("milli_reserved") + take.milli,
        "mig_slots_used": F("mig_slots_used") + take.mask,
        "share_tenant_id": Coalesce(take.tenant, F("share_tenant_id")),
    }


# --- rendered to SQL -------------------------------------------------------------------------


def _column(name: str, field) -> RawSQL:
    return RawSQL(f"d.{name}", (), output_field=field)


# The amounts of a part as columns of the JSON recordset `d` of the bulk statements.
_NODE_COLUMNS = SimpleNamespace(
    cpu=_column("cpu", IntegerField()),
    mem=_column("mem", IntegerField()),
    scratch=_column("scratch", IntegerField()),
    drain_exempt=_column("drain_exempt", BooleanField()),
)
_GPU_COLUMNS = SimpleNamespace(
    kind=_column("kind", CharField()),
    milli=_column("milli", IntegerField()),
    mask=_column("mask", IntegerField()),
    tenant=_column("tenant", BigIntegerField()),
)
_STATEMENTS: dict[str, tuple[str, dict]] = {}


def _named(sql: str, params, prefix: str) -> tuple[str, dict]:
    """A compiled fragment's positional parameters as named ones (`%(prefix0)s`, ...)."""
    pieces = sql.split("%s")
    if len(pieces) != len(params) + 1 or any("%" in piece for piece in pieces):
        raise ValueError(f"unexpected placeholders in {sql!r}")
    named = {f"{prefix}{i}": value for i, value in enumerate(params)}
    return "".join(
        p + (f"%({prefix}{i})s" if i < len(params) else "") for i, p in enumerate(pieces)
    ), named


def _render(model, where: Q, writes: dict, prefix: str) -> tuple[str, str, dict]:
    """`where` and `writes` as SQL over `model`'s table with unqualified columns (the bulk
    statements name the target table, not an alias): (SET list, WHERE clause, parameters)."""
    query = Query(model, alias_cols=False)
    compiler = query.get_compiler(connection=connection)
    sets, params = [], []
    for name, expression in writes.items():
        resolved = expression.resolve_expression(query, allow_joins=False, for_save=True)
        sql, values = compiler.compile(resolved)
        sets.append(f"{connection.ops.quote_name(model._meta.get_field(name).column)} = {sql}")
        params += values
    sql, values = query.build_where(where).as_sql(compiler, connection)
    set_sql, named = _named(", ".join(sets), params, f"{prefix}s")
    where_sql, where_named = _named(sql, values, f"{prefix}w")
    return set_sql, where_sql, named | where_named


def node_update_sql() -> tuple[str, dict]:
    """The guarded node UPDATE over the recordset `%(nodes)s` ([{node, cpu, mem, scratch}]) of
    the nodes `%(ids)s`, returning the ids of the nodes that took their part."""
    if "node" not in _STATEMENTS:
        table = Node._meta.db_table
        sets, where, params = _render(
            Node, node_guard(_NODE_COLUMNS), node_writes(_NODE_COLUMNS), "n"
        )
        _STATEMENTS["node"] = (
            f"UPDATE {table} SET {sets} FROM json_to_recordset(CAST(%(nodes)s AS json)) "
            "AS d(node bigint, cpu integer, mem integer, scratch integer, drain_exempt boolean) "
            # the ids again as an array: the id index finds the rows (a join with the recordset
            # alone scans every ready node)
            f"WHERE {table}.id = ANY(CAST(%(ids)s AS bigint[])) AND {table}.id = d.node "
            f"AND {where} RETURNING {table}.id",
            params,
        )
    return _STATEMENTS["node"]


def _gpu_update_sql() -> tuple[str, dict]:
    if "gpu" not in _STATEMENTS:
        table = GpuDevice._meta.db_table
        guards = gpu_guards(_GPU_COLUMNS)
        either = Q()
        for kind, guard in guards.items():
            either |= Q(Exact(_GPU_COLUMNS.kind, kind), guard)
        sets, where, params = _render(GpuDevice, either, gpu_writes(_GPU_COLUMNS), "g")
        _STATEMENTS["gpu"] = (
            f"UPDATE {table} SET {sets} FROM json_to_recordset(CAST(%(gpus)s AS json)) "
            "AS d(gpu bigint, node bigint, kind text, milli integer, mask integer, tenant bigint) "
            f"WHERE {table}.id = ANY(CAST(%(ids)s AS bigint[])) AND {table}.id = d.gpu "
            f"AND {table}.node_id = d.node AND {where} "
            f"RETURNING {table}.id",
            params,
        )
    return _STATEMENTS["gpu"]


def _json(parts) -> str:
    return orjson.dumps([{name: getattr(p, name) for name in p.__slots__} for p in parts]).decode()


# --- taking ----------------------------------------------------------------------------------


def lock(node_ids, gpu_ids) -> None:
    """Row locks on the nodes, then their GPUs, each in id order: the lock order of every
    writer, taken before a bulk statement that updates several rows in no given order."""
    for model, ids in ((Node, node_ids), (GpuDevice, gpu_ids)):
        if len(ids) > 1:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT id FROM {model._meta.db_table} "
                    "WHERE id = ANY(CAST(%(ids)s AS bigint[])) ORDER BY id FOR UPDATE",
                    {"ids": sorted(ids)},
                )


def take_nodes(parts: list[NodePart], fused: list | None = None) -> tuple[set[int], list]:
    """The guarded node UPDATE: each node takes its part whole or not at all. Returns the ids
    of the nodes that took it; and on PostgreSQL with `fused` (lease rows), the same statement
    inserts those of them whose node took (`lease_rows.fused_insert`): (position + 1, lease id)
    of each."""
    if not backend.postgresql():
        took = set()
        for part in sorted(parts, key=lambda p: p.node):  # the lock order
            guard = node_guard(_node_values(part))
            if Node.objects.filter(guard, pk=part.node).update(**node_writes(part)):
                took.add(part.node)
        return took, []
    sql, params = node_update_sql()
    params = {**params, "nodes": _json(parts), "ids": [part.node for part in parts]}
    if fused is not None:
        sql, rows = fused_insert(sql, fused)
        params |= rows
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        result = cursor.fetchall()
    if fused is None:
        return {node for (node,) in result}, []
    # every node of `parts` has a lease in `fused`: it took its part when one was inserted
    took = {fused[position - 1].node_id for position, _ in result}
    return took & {part.node for part in parts}, result


def take_gpus(parts: list[GpuPart]) -> set[int]:
    """The guarded GPU updates (after their nodes'); the ids of the GPUs that took their part."""
    if not parts:
        return set()
    if not backend.postgresql():
        took = set()
        for part in sorted(parts, key=lambda p: p.gpu):
            guard = gpu_guards(_values(part)).get(part.kind)
            gpus = GpuDevice.objects.filter(pk=part.gpu, node_id=part.node)
            if guard is not None and gpus.filter(guard).update(**gpu_writes(_values(part))):
                took.add(part.gpu)
        return took
    sql, params = _gpu_update_sql()
    with connection.cursor() as cursor:
        cursor.execute(sql, {**params, "gpus": _json(parts), "ids": [p.gpu for p in parts]})
        return {row[0] for row in cursor.fetchall()}


def _node_values(part: NodePart) -> SimpleNamespace:
    # the part's amounts as ORM values (its flag an expression, as the recordset's column is)
    return SimpleNamespace(
        cpu=part.cpu,
        mem=part.mem,
        scratch=part.scratch,
        drain_exempt=Value(part.drain_exempt, output_field=BooleanField()),
    )


def _values(part: GpuPart) -> SimpleNamespace:
    # the part's amounts as ORM values (a NULL tenant needs its type)
    return SimpleNamespace(
        milli=part.milli, mask=part.mask, tenant=Value(part.tenant, output_field=BigIntegerField())
    )


# --- returning -------------------------------------------------------------------------------


def return_capacity(lease) -> None:
    """Guarded decrements in the lock order (node, then its GPUs by id); a backfill holds
    nothing on the ledger. Either way `capacity_returned` tells the layers above."""
    if lease.backfill_of_id is not None:
        capacity_returned.send(sender=type(lease), lease=lease)
        return
    cpu, mem, scratch = lease.cpu_millicores, lease.memory_mib, lease.scratch_mib
    updated = Node.objects.filter(
        pk=lease.node_id,
        cpu_millicores_reserved__gte=cpu,
        memory_mib_reserved__gte=mem,
        scratch_mib_reserved__gte=scratch,
    ).update(
        cpu_millicores_reserved=F("cpu_millicores_reserved") - cpu,
        memory_mib_reserved=F("memory_mib_reserved") - mem,
        scratch_mib_reserved=F("scratch_mib_reserved") - scratch,
    )
    if not updated:
        raise RuntimeError(f"ledger of node {lease.node_id} is below lease {lease.pk}")
    for alloc in sorted(lease.gpu_allocations, key=lambda a: a["gpu"]):
        gpus = GpuDevice.objects.filter(pk=alloc["gpu"])
        if alloc["mig_slots"]:
            mask = alloc["mig_slots"]
            updated = gpus.filter(Exact(F("mig_slots_used").bitand(mask), mask)).update(
                mig_slots_used=F("mig_slots_used") - mask
            )
        else:
            milli = alloc["milli"]
            updated = gpus.filter(milli_reserved__gte=milli).update(
                milli_reserved=F("milli_reserved") - milli,
                share_tenant=Case(
                    When(milli_reserved=milli, then=Value(None)), default=F("share_tenant")
                ),
            )
        if not updated:
            raise RuntimeError(f"ledger of GPU {alloc['gpu']} is below lease {lease.pk}")
    capacity_returned.send(sender=type(lease), lease=lease)


def adopt_capacity(lease) -> None:
    """The backfill `lease` holds its own capacity from now: called in the transaction in which
    its reservation returned what it held (return_capacity, the rows still locked), of which
    the backfill's part is a share — backfills are admitted only within what their
    reservation holds (leases/services/backfill.py, under the reservation's row lock) — so the
    increments move capacity the ledger has just given back, and are not guarded again (the
    node may be draining or silent by now: the container runs all the same)."""
    Node.objects.filter(pk=lease.node_id).update(
        cpu_millicores_reserved=F("cpu_millicores_reserved") + lease.cpu_millicores,
        memory_mib_reserved=F("memory_mib_reserved") + lease.memory_mib,
        scratch_mib_reserved=F("scratch_mib_reserved") + lease.scratch_mib,
    )
    mixing = lease.pool.allow_tenant_mixing_on_shared_gpus
    for alloc in sorted(lease.gpu_allocations, key=lambda a: a["gpu"]):
        gpus = GpuDevice.objects.filter(pk=alloc["gpu"])
        if alloc["mig_slots"]:
            gpus.update(mig_slots_used=F("mig_slots_used").bitor(alloc["mig_slots"]))
            continue
        sharer = None if mixing or alloc["milli"] >= 1000 else lease.tenant_id
        gpus.update(
            milli_reserved=F("milli_reserved") + alloc["milli"],
            share_tenant=Coalesce(F("share_tenant"), Value(sharer, output_field=BigIntegerField())),
        )
