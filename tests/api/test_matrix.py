"""Who may do what (#13, #17): every /api/v1 route and method against thirteen kinds of caller, each
answered with its exact status, on real objects (two tenants' jobs, leases, a node with its
running job and another node, tokens that are read-only, expired or revoked).

A route the URL resolver knows and this table does not fails `test_every_api_route_has_a_row`,
so every new endpoint gets its row. Lists name only what the caller may see and count nothing
else; another tenant's objects are 404, never 403. Each request runs in a savepoint that is
rolled back, so every row sees the same world, built once for the module.
"""

import re
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.test import override_settings
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from config.builders import (
    SYSTEM,
    build_person,
    build_pool,
    build_secret,
    build_tenant,
    build_token,
    cpu_request,
    enroll_node,
    gpu_inventory,
    pinned_test_image,
    submit_job,
)
from jobs.retention import retention_set
from leases import services as lease_services
from nodes import services as node_services
from nodes.services import enrollment_token_issue
from pools.actors import Actor
from pools.choices import PlatformRole, TenantRole
from pools.models import ApiToken, ResourceShape, TenantBucket
from pools.services import api_token_revoke, support_grant_create
from scheduling.passes import scheduling_pass
from storage.services import volume_create
from tests.clients import SignedClient, bearer_client
from worker_agent.identity import NodeKey

ACTORS = (
    "anonymous",
    "outsider",  # a member of another tenant
    "member",
    "tenant_admin",
    "operator",
    "support",  # an operator under the tenant admin's support grant for vision
    "policy_admin",
    "shape_admin",
    "node",  # the credential of the node that runs the member's job
    "other_node",  # another node's credential
    "read_only",  # the member's token with the read scope only
    "expired",  # the member's expired token
    "revoked",  # the member's revoked token
)


@dataclass(frozen=True)
class Row:
    method: str
    route: str  # the resolver's pattern, {name} for each parameter
    url: str  # formatted with the world: {w.job}
    expected: str  # one status per actor, in ACTORS' order
    body: object = None
    multipart: bool = False


# 401: no or a dead credential. 403: a permission (role, scope, person vs node) refuses.
# 404: not visible to the caller (another tenant's, another node's, or nobody's but its owner).
# The columns, in ACTORS' order: anon out mem adm op sup pad sha nod oth ro exp rev
ROWS = [
    Row("GET", "me", "me", "401 200 200 200 200 200 200 200 403 403 200 401 401"),
    # tenants: their people (and operators, policy admins) see them; admins manage members
    Row("GET", "tenants", "tenants", "401 200 200 200 200 200 200 200 403 403 200 401 401"),
    Row(
        "GET",
        "tenants/{slug}",
        "tenants/vision",
        "401 404 200 200 200 200 200 404 403 403 200 401 401",
    ),
    Row(
        "GET",
        "tenants/{slug}/members",
        "tenants/vision/members",
        "401 404 403 200 200 200 403 404 403 403 403 401 401",
    ),
    Row(
        "POST",
        "tenants/{slug}/members",
        "tenants/vision/members",
        "401 404 403 202 403 403 403 404 403 403 403 401 401",
        {"user": "newcomer", "role": "member"},
    ),
    Row(
        "GET",
        "tenants/{slug}/member-events",
        "tenants/vision/member-events",
        "401 404 403 200 200 200 403 404 403 403 403 401 401",
    ),
    Row(
        "PATCH",
        "tenants/{slug}/members/{username}",
        "tenants/vision/members/member",
        "401 404 403 200 403 403 403 404 403 403 403 401 401",
        {"role": "admin"},
    ),
    Row(
        "DELETE",
        "tenants/{slug}/members/{username}",
        "tenants/vision/members/member",
        "401 404 403 204 403 403 403 404 403 403 403 401 401",
    ),
    Row(
        "GET",
        "tenants/{slug}/secrets",
        "tenants/vision/secrets",
        "401 404 200 200 403 403 403 404 403 403 200 401 401",
    ),
    Row(
        "POST",
        "tenants/{slug}/secrets",
        "tenants/vision/secrets",
        "401 404 403 201 403 403 403 404 403 403 403 401 401",
        {"name": "db-password", "value": "hunter22"},
    ),
    Row(
        "DELETE",
        "tenants/{slug}/secrets/{name}",
        "tenants/vision/secrets/api-token",
        "401 404 403 204 403 403 403 404 403 403 403 401 401",
    ),
    # support grants: a tenant admin lets one operator read its logs and outputs for a while
    Row(
        "GET",
        "tenants/{slug}/support-grants",
        "tenants/vision/support-grants",
        "401 404 403 200 200 200 403 404 403 403 403 401 401",
    ),
    Row(
        "POST",
        "tenants/{slug}/support-grants",
        "tenants/vision/support-grants",
        "401 404 403 201 403 403 403 404 403 403 403 401 401",
        {"operator": "operator", "reason": "ticket 17", "ttl_hours": 2},
    ),
    Row(
        "DELETE",
        "tenants/{slug}/support-grants/{grant_id}",
        "tenants/vision/support-grants/{w.grant.pk}",
        "401 404 403 200 403 403 403 404 403 403 403 401 401",
    ),
    # pools and shapes: shared infrastructure, every person reads; policy admins change policy
    Row(
        "GET",
        "compute-pools",
        "compute-pools",
        "401 200 200 200 200 200 200 200 403 403 200 401 401",
    ),
    Row(
        "GET",
        "compute-pools/{pk}",
        "compute-pools/{w.pool.pk}",
        "401 200 200 200 200 200 200 200 403 403 200 401 401",
    ),
    Row(
        "GET",
        "compute-pools/{pk}/shapes",
        "compute-pools/matrix/shapes",
        "401 200 200 200 200 200 200 200 403 403 200 401 401",
    ),
    Row("GET", "pools", "pools", "401 200 200 200 200 200 200 200 403 403 200 401 401"),
    Row(
        "GET", "pools/{slug}", "pools/matrix", "401 200 200 200 200 200 200 200 403 403 200 401 401"
    ),
    Row(
        "GET",
        "pools/{slug}/policy-versions",
        "pools/matrix/policy-versions",
        "401 200 200 200 200 200 200 200 403 403 200 401 401",
    ),
    Row(
        "POST",
        "pools/{slug}/policy-versions",
        "pools/matrix/policy-versions",
        "401 403 403 403 403 403 201 403 403 403 403 401 401",
        {"weights": {"bin_pack": 1}},
    ),
    Row(
        "GET",
        "pools/{slug}/capacity",
        "pools/matrix/capacity",
        "401 403 403 403 200 200 403 403 403 403 403 401 401",
    ),
    Row("GET", "shapes", "shapes", "401 200 200 200 200 200 200 200 403 403 200 401 401"),
    Row(
        "GET",
        "shapes/{pk}",
        "shapes/{w.shape.pk}",
        "401 200 200 200 200 200 200 200 403 403 200 401 401",
    ),
    # tokens: each person's own, operators included
    Row("GET", "tokens", "tokens", "401 200 200 200 200 200 200 200 403 403 200 401 401"),
    Row(
        "POST",
        "tokens",
        "tokens",
        "401 201 201 201 201 201 201 201 403 403 403 401 401",
        {"name": "t"},
    ),
    Row(
        "GET",
        "tokens/{pk}",
        "tokens/{w.spare_token.pk}",
        "401 404 200 404 404 404 404 404 403 403 200 401 401",
    ),
    Row(
        "POST",
        "tokens/{pk}/revoke",
        "tokens/{w.spare_token.pk}/revoke",
        "401 404 200 404 404 404 404 404 403 403 403 401 401",
    ),
    # jobs: the tenant's people submit, read, cancel; logs and outputs alike; operators see all
    Row("GET", "jobs", "jobs", "401 200 200 200 200 200 200 200 403 403 200 401 401"),
    Row("POST", "jobs", "jobs", "401 400 201 201 400 400 400 400 403 403 403 401 401", "job"),
    Row(
        "GET", "jobs/{pk}", "jobs/{w.job.pk}", "401 404 200 200 200 200 404 404 403 403 200 401 401"
    ),
    Row(
        "POST",
        "jobs/{pk}/cancel",
        "jobs/{w.job.pk}/cancel",
        "401 404 200 200 200 200 404 404 403 403 403 401 401",
    ),
    Row(
        "GET",
        "jobs/{pk}/events",
        "jobs/{w.job.pk}/events",
        "401 404 200 200 200 200 404 404 403 403 200 401 401",
    ),
    Row(
        "GET",
        "jobs/{pk}/explain",
        "jobs/{w.job.pk}/explain",
        "401 404 200 200 200 200 404 404 403 403 200 401 401",
    ),
    Row(
        "GET",
        "jobs/{pk}/trace",
        "jobs/{w.job.pk}/trace",
        "401 404 200 200 200 200 404 404 403 403 200 401 401",
    ),
    Row(
        "GET",
        "jobs/{pk}/logs",
        "jobs/{w.job.pk}/logs",
        "401 404 200 200 403 200 404 404 403 403 403 401 401",
    ),
    Row(
        "GET",
        "jobs/{pk}/outputs",
        "jobs/{w.job.pk}/outputs",
        "401 404 200 200 403 200 404 404 403 403 403 401 401",
    ),
    Row(
        "GET",
        "jobs/{pk}/outputs/{name}",
        "jobs/{w.job.pk}/outputs/result.txt",
        "401 404 200 200 403 200 404 404 403 403 403 401 401",
    ),
    # leases: the tenant's people, operators, and the agent of the node holding them
    Row(
        "GET",
        "compute-leases",
        "compute-leases",
        "401 200 200 200 200 200 200 200 200 200 200 401 401",
    ),
    Row(
        "POST",
        "compute-leases",
        "compute-leases",
        "401 400 201 201 201 201 400 400 403 403 403 401 401",
        "lease",
    ),
    Row(
        "GET",
        "compute-leases/accounting",
        "compute-leases/accounting",
        "401 200 200 200 200 200 200 200 403 403 200 401 401",
    ),
    Row(
        "GET",
        "compute-leases/{pk}",
        "compute-leases/{w.lease.pk}",
        "401 404 200 200 200 200 404 404 200 404 200 401 401",
    ),
    Row(
        "GET",
        "compute-leases/{pk}/events",
        "compute-leases/{w.lease.pk}/events",
        "401 404 200 200 200 200 404 404 200 404 200 401 401",
    ),
    Row(
        "POST",
        "compute-leases/{pk}/commit",
        "compute-leases/{w.reserved.pk}/commit",
        "401 404 200 200 200 200 404 404 200 404 403 401 401",
        "reserved_token",
    ),
    Row(
        "POST",
        "compute-leases/{pk}/renew",
        "compute-leases/{w.lease.pk}/renew",
        "401 404 200 200 200 200 404 404 200 404 403 401 401",
        "lease_token",
    ),
    Row(
        "POST",
        "compute-leases/{pk}/release",
        "compute-leases/{w.lease.pk}/release",
        # a live job's lease: a person cancels the job instead (job_lease); its node may
        "401 404 409 409 409 409 404 404 200 404 403 401 401",
        "lease_token",
    ),
    Row(
        "POST",
        "compute-leases/{pk}/usage",
        "compute-leases/{w.lease.pk}/usage",
        "401 403 403 403 200 200 403 403 200 404 403 401 401",
        "usage",
    ),
    Row("GET", "quotas", "quotas", "401 200 200 200 200 200 200 200 403 403 200 401 401"),
    # a tenant's retention of outputs: its people (operators, policy admins) read, admins set
    Row(
        "GET",
        "output-retention",
        "output-retention",
        "401 200 200 200 200 200 200 200 403 403 200 401 401",
    ),
    Row(
        "POST",
        "output-retention",
        "output-retention",
        "401 400 403 200 403 403 403 400 403 403 403 401 401",
        {"tenant": "vision", "output_retention_days": 9},
    ),
    Row(
        "GET",
        "output-retention/{pk}",
        "output-retention/{w.retention.pk}",
        "401 404 200 200 200 200 200 404 403 403 200 401 401",
    ),
    Row(
        "DELETE",
        "output-retention/{pk}",
        "output-retention/{w.retention.pk}",
        "401 404 403 204 403 403 403 404 403 403 403 401 401",
    ),
    # nodes and enrollment: operators (their actions need the `operate` scope)
    Row("GET", "nodes", "nodes", "401 403 403 403 200 200 403 403 403 403 403 401 401"),
    Row(
        "GET",
        "nodes/{pk}",
        "nodes/{w.node.pk}",
        "401 403 403 403 200 200 403 403 403 403 403 401 401",
    ),
    Row(
        "GET",
        "nodes/{pk}/events",
        "nodes/{w.node.pk}/events",
        "401 403 403 403 200 200 403 403 403 403 403 401 401",
    ),
    Row(
        "POST",
        "nodes/{pk}/drain",
        "nodes/{w.node.pk}/drain",
        "401 403 403 403 200 200 403 403 403 403 403 401 401",
        {"message": "maintenance"},
    ),
    Row(
        "POST",
        "nodes/{pk}/cancel-drain",
        "nodes/{w.node.pk}/cancel-drain",
        "401 403 403 403 409 409 403 403 403 403 403 401 401",
        {},
    ),
    Row(
        "POST",
        "nodes/{pk}/quarantine",
        "nodes/{w.node.pk}/quarantine",
        "401 403 403 403 200 200 403 403 403 403 403 401 401",
        {"message": "flaky GPU"},
    ),
    Row(
        "POST",
        "nodes/{pk}/release",
        "nodes/{w.node.pk}/release",
        "401 403 403 403 409 409 403 403 403 403 403 401 401",
        {},
    ),
    Row(
        "POST",
        "nodes/{pk}/retire",
        "nodes/{w.node.pk}/retire",
        "401 403 403 403 200 200 403 403 403 403 403 401 401",
        {},
    ),
    Row(
        "POST",
        "nodes/{pk}/revoke-credentials",
        "nodes/{w.node.pk}/revoke-credentials",
        "401 403 403 403 200 200 403 403 403 403 403 401 401",
        {},
    ),
    Row(
        "POST",
        "nodes/{pk}/rotate-credential",
        "nodes/{w.node.pk}/rotate-credential",
        "401 403 403 403 201 201 403 403 403 403 403 401 401",
    ),
    Row(
        "GET",
        "enrollment-tokens",
        "enrollment-tokens",
        "401 403 403 403 200 200 403 403 403 403 403 401 401",
    ),
    Row(
        "POST",
        "enrollment-tokens",
        "enrollment-tokens",
        "401 403 403 403 201 201 403 403 403 403 403 401 401",
        {"pool": "matrix"},
    ),
    Row(
        "GET",
        "enrollment-tokens/{pk}",
        "enrollment-tokens/{w.enrollment_token.pk}",
        "401 403 403 403 200 200 403 403 403 403 403 401 401",
    ),
    Row(
        "POST",
        "enrollment-tokens/{pk}/revoke",
        "enrollment-tokens/{w.enrollment_token.pk}/revoke",
        "401 403 403 403 200 200 403 403 403 403 403 401 401",
    ),
    # enrollment: the enrollment token in the body is the credential; a node cannot enroll
    Row(
        "POST", "enroll", "enroll", "201 201 201 201 201 201 201 201 403 403 201 201 201", "enroll"
    ),
    # the agent: node credentials only, each acting on its own node and its own jobs
    Row("GET", "agent/me", "agent/me", "401 403 403 403 403 403 403 403 200 200 403 401 401"),
    Row(
        "POST",
        "agent/heartbeat",
        "agent/heartbeat",
        "401 403 403 403 403 403 403 403 200 200 403 401 401",
        {},
    ),
    Row(
        "POST",
        "agent/inventory",
        "agent/inventory",
        "401 403 403 403 403 403 403 403 202 202 403 401 401",
        "inventory",
    ),
    Row(
        "GET", "agent/probes", "agent/probes", "401 403 403 403 403 403 403 403 200 200 403 401 401"
    ),
    Row(
        "POST",
        "agent/probes/{probe_id}/result",
        "agent/probes/{w.probe.pk}/result",
        "401 403 403 403 403 403 403 403 200 404 403 401 401",
        {"result": {"passed": False}},
    ),
    Row(
        "POST",
        "agent/credential/rotate",
        "agent/credential/rotate",
        "401 403 403 403 403 403 403 403 201 201 403 401 401",
    ),
    Row(  # a key rotation needs the new key and its proof (tests/nodes/test_identity.py)
        "POST",
        "agent/key/rotate",
        "agent/key/rotate",
        "401 403 403 403 403 403 403 403 400 400 403 401 401",
        {},
    ),
    Row(
        "GET",
        "agent/assignments",
        "agent/assignments",
        "401 403 403 403 403 403 403 403 200 200 403 401 401",
    ),
    Row(  # the long poll for a push (jobs/api/wait.py): nothing comes, {"changed": false}
        "GET",
        "agent/assignments/wait",
        "agent/assignments/wait?timeout=1",
        "401 403 403 403 403 403 403 403 200 200 403 401 401",
    ),
    Row(
        "POST",
        "agent/jobs/{job_id}/report",
        "agent/jobs/{w.job.pk}/report",
        "401 403 403 403 403 403 403 403 200 403 403 401 401",
        "report",
    ),
    Row(
        "POST",
        "agent/jobs/{job_id}/logs",
        "agent/jobs/{w.job.pk}/logs",
        "401 403 403 403 403 403 403 403 200 403 403 401 401",
        "log",
    ),
    Row(
        "POST",
        "agent/jobs/{job_id}/outputs",
        "agent/jobs/{w.job.pk}/outputs",
        "401 403 403 403 403 403 403 403 201 403 403 401 401",
        "outputs",
        multipart=True,
    ),
    # an s3:// destination's presigned PUT and its record: this job's outputs go to the
    # control plane (output_destination ""), so its own node is told so (409)
    Row(
        "POST",
        "agent/jobs/{job_id}/outputs/presign",
        "agent/jobs/{w.job.pk}/outputs/presign",
        "401 403 403 403 403 403 403 403 409 403 403 401 401",
        "object_output",
    ),
    Row(
        "POST",
        "agent/jobs/{job_id}/outputs/record",
        "agent/jobs/{w.job.pk}/outputs/record",
        "401 403 403 403 403 403 403 403 409 403 403 401 401",
        "object_output",
    ),
    # registered buckets: the tenant's people list them, its admins register and remove them
    Row("GET", "buckets", "buckets", "401 200 200 200 200 200 200 200 403 403 200 401 401"),
    Row(
        "POST",
        "buckets",
        "buckets",
        "401 400 403 400 400 400 400 400 403 403 403 401 401",
        {
            "tenant": "vision",
            "bucket": "vision-more",
            "endpoint": "http://127.0.0.1:1",
            "access_key_id": "AKIAX",
            "secret_access_key": "x",
        },
    ),
    Row(
        "GET",
        "buckets/{pk}",
        "buckets/{w.bucket.pk}",
        "401 404 200 200 404 404 404 404 403 403 200 401 401",
    ),
    Row(
        "DELETE",
        "buckets/{pk}",
        "buckets/{w.bucket.pk}",
        "401 404 403 204 404 404 404 404 403 403 403 401 401",
    ),
    Row(
        "GET",
        "buckets/events",
        "buckets/events",
        "401 403 403 200 403 403 403 403 403 403 403 401 401",
    ),
    # persistent volumes (docs/storage.md): the tenant's people; operators read their metadata
    # (a volume's node, state, risk), never delete or export one
    Row("GET", "volumes", "volumes", "401 200 200 200 200 200 200 200 403 403 200 401 401"),
    Row(
        "POST",
        "volumes",
        "volumes",
        "401 400 201 201 400 400 400 400 403 403 403 401 401",
        {"tenant": "vision", "pool": "matrix", "name": "more-data", "size_mib": 8},
    ),
    Row(
        "GET",
        "volumes/{pk}",
        "volumes/{w.volume.pk}",
        "401 404 200 200 200 200 404 404 403 403 200 401 401",
    ),
    Row(
        "GET",
        "volumes/{pk}/events",
        "volumes/{w.volume.pk}/events",
        "401 404 200 200 200 200 404 404 403 403 200 401 401",
    ),
    Row(
        "DELETE",
        "volumes/{pk}",
        "volumes/{w.volume.pk}",
        "401 404 200 200 403 403 404 404 403 403 403 401 401",
    ),
    Row(
        "POST",
        "volumes/{pk}/export",
        "volumes/{w.volume.pk}/export",
        "401 404 202 202 403 403 404 404 403 403 403 401 401",
        {"destination": "s3://vision-data/exports/"},
    ),
    Row(
        "POST",
        "agent/volumes",
        "agent/volumes",
        "401 403 403 403 403 403 403 403 200 200 403 401 401",
        {"volumes": []},
    ),
    Row(
        "GET",
        "agent/jobs/{job_id}/checkpoint",
        "agent/jobs/{w.job.pk}/checkpoint",
        "401 403 403 403 403 403 403 403 404 403 403 401 401",
    ),
    Row(
        "POST",
        "agent/jobs/{job_id}/checkpointed",
        "agent/jobs/{w.job.pk}/checkpointed",
        "401 403 403 403 403 403 403 403 200 403 403 401 401",
        "lease_token",
    ),
]


# --- the world: built once for the module, every request rolled back ------------------------


@dataclass
class World:
    pool: object
    shape: object
    vision: object
    nlp: object
    job: object  # the member's job, running on `node`
    lease: object  # its committed lease
    reserved: object  # a reserved lease of the member's tenant on `node`
    node: object
    other_node: object
    probe: object
    spare_token: object  # a token of the member's, to read and revoke
    enrollment_token: object
    enroll_secret: str
    secrets: dict  # actor → bearer secret
    jobs: dict  # tenant slug → job ids
    leases: dict  # tenant slug → lease ids

    grant: object  # the tenant admin's support grant for vision to `support`
    retention: object = None  # vision's retention of outputs in every pool
    bucket: object = None  # vision's registered bucket (docs/storage.md "Object stores")
    volume: object = None  # vision's persistent volume (docs/storage.md "Persistent volumes")

    def client(self, actor):
        return bearer_client(self.secrets.get(actor))

    def body(self, name):
        token = {"fencing_token": str(self.lease.fencing_token)}
        return {
            "job": {
                "tenant": "vision",
                "pool": "matrix",
                "name": "from-the-matrix",
                "shape": "cpu-small",
                "image": pinned_test_image(),
                "command": ["true"],
            },
            "lease": {
                "pool": "matrix",
                "tenant": "vision",
                "resources": cpu_request(cpu=100, memory=64),
                "duration_s": 60,
            },
            "reserved_token": {"fencing_token": str(self.reserved.fencing_token)},
            "lease_token": token,
            "usage": {**token, "cpu_millicores": 100, "memory_mib": 64},
            "enroll": {
                "token": self.enroll_secret,
                "name": "newcomer-node",
                "inventory": gpu_inventory(gpus=1, uuid_tag="new0"),
            },
            "inventory": gpu_inventory(gpus=2, uuid_tag="0001"),
            "report": {**token, "step": "succeeded", "exit_code": 0},
            "log": {**token, "text": "a line\n"},
            "outputs": {**token, "files": [SimpleUploadedFile("more.txt", b"more\n")]},
            "object_output": {**token, "name": "o.bin", "size": 3, "sha256": "0" * 64},
        }[name]


def _enroll(pool, name, tag, operator):
    enrolled = enroll_node(
        pool,
        name,
        actor=Actor.for_user(operator),
        inventory=gpu_inventory(gpus=2, uuid_tag=tag),
    )
    node = node_services.node_heartbeat(node=enrolled.node, actor=Actor.for_node(enrolled.node))
    assert node.state == "ready", node.state
    return enrolled


def _bucket(tenant):
    """A registered bucket, made without the store's HEAD (the matrix asks no store)."""
    row = TenantBucket(tenant=tenant, bucket="vision-data", endpoint="http://127.0.0.1:9000")
    row.seal("AKIAMATRIX", "matrix-secret")
    row.save()
    return row


def _build_world() -> World:
    pool = build_pool("matrix", exact_capacity=True)
    shape = ResourceShape.objects.create(
        pool=pool, name="cpu-small", cpu_millicores_min=1000, memory_mib_min=1024
    )
    vision, nlp = build_tenant("vision"), build_tenant("nlp")
    member = build_person("member", tenant=vision)
    people = {
        "member": member,
        "outsider": build_person("outsider", tenant=nlp),
        "tenant_admin": build_person("tadmin", tenant=vision, role=TenantRole.ADMIN),
        "operator": build_person("operator", platform_role=PlatformRole.OPERATOR),
        "support": build_person("support", platform_role=PlatformRole.OPERATOR),
        "policy_admin": build_person("padmin", platform_role=PlatformRole.POLICY_ADMIN),
        "shape_admin": build_person("sadmin", platform_role=PlatformRole.SHAPE_ADMIN),
    }
    build_person("newcomer")
    build_secret(vision, "api-token")
    person_scopes = ("read", "logs:read", "outputs:read", "write")
    secrets = {
        name: build_token(
            user,
            scopes=(*person_scopes, "operate")
            if name in ("operator", "support")
            else person_scopes,
        )
        for name, user in people.items()
    }
    grant = support_grant_create(
        tenant=vision,
        operator="support",
        ttl=timedelta(hours=1),
        reason="ticket 17",
        actor=Actor.for_user(people["tenant_admin"]),
    )
    secrets["read_only"] = build_token(member, scopes=("read",))
    secrets["expired"] = build_token(member, name="expired")
    ApiToken.objects.filter(user=member, name="expired").update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )
    secrets["revoked"] = build_token(member, name="revoked")
    api_token_revoke(token=ApiToken.objects.get(user=member, name="revoked"))
    build_token(member, name="spare")
    spare = ApiToken.objects.get(user=member, name="spare")

    enrolled = _enroll(pool, "node-a", "0001", people["operator"])
    node = enrolled.node
    secrets["node"] = enrolled.secret
    job = submit_job(pool, vision, cpu=1000, memory=1024)
    other_job = submit_job(pool, nlp, cpu=1000, memory=1024)
    placed = scheduling_pass(pool_id=pool.pk).placed
    assert {job.pk, other_job.pk} <= set(placed)
    job.refresh_from_db()
    lease = job.leases.get()
    agent = bearer_client(enrolled.secret)
    base = f"/api/v1/agent/jobs/{job.pk}"
    for step in ("pulling", "starting", "running"):
        body = {"fencing_token": str(lease.fencing_token), "step": step}
        assert agent.post(f"{base}/report", body, format="json").status_code == 200, step
    token = {"fencing_token": str(lease.fencing_token)}
    assert (
        agent.post(f"{base}/logs", {**token, "text": "hello\n"}, format="json").status_code == 200
    )
    upload = {**token, "files": [SimpleUploadedFile("result.txt", b"42\n")]}
    assert agent.post(f"{base}/outputs", upload).status_code == 201
    lease.refresh_from_db()
    reserved = lease_services.lease_reserve(
        pool=pool,
        tenant=vision,
        request=cpu_request(cpu=100, memory=64),
        actor=SYSTEM,
        duration=timedelta(minutes=10),
    )
    nlp_lease = lease_services.lease_reserve(
        pool=pool,
        tenant=nlp,
        request=cpu_request(cpu=100, memory=64),
        actor=SYSTEM,
        duration=timedelta(minutes=10),
    )
    gpu = node.gpus.order_by("index").first()
    probe = node_services.probe_request(
        node=node, kind="recovery", actor=Actor.for_user(people["operator"]), gpu=gpu
    )
    other = _enroll(pool, "node-b", "0002", people["operator"])
    secrets["other_node"] = other.secret
    enrollment_token, enroll_secret = enrollment_token_issue(
        pool=pool, actor=Actor.for_user(people["operator"]), max_uses=5, ttl=timedelta(hours=1)
    )
    return World(
        pool=pool,
        shape=shape,
        vision=vision,
        nlp=nlp,
        job=job,
        lease=lease,
        reserved=reserved,
        node=node,
        other_node=other.node,
        probe=probe,
        spare_token=spare,
        enrollment_token=enrollment_token,
        enroll_secret=enroll_secret,
        secrets=secrets,
        grant=grant,
        retention=retention_set(tenant=vision, pool=None, days=40, actor=SYSTEM),
        bucket=_bucket(vision),
        volume=volume_create(
            tenant=vision, pool=pool, name="matrix-data", size_mib=8, actor=SYSTEM
        ),
        jobs={"vision": {job.pk}, "nlp": {other_job.pk}},
        leases={
            "vision": {lease.pk, reserved.pk},
            "nlp": {nlp_lease.pk, *other_job.leases.values_list("pk", flat=True)},
        },
    )


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, tmp_path_factory):
    """One world for the module, in a transaction rolled back at its end (each test's own
    transaction is a savepoint inside it)."""
    media = tmp_path_factory.mktemp("media")
    with (
        django_db_blocker.unblock(),
        override_settings(MEDIA_ROOT=str(media), LEASE_THROTTLE_RATE="", TOKEN_THROTTLE_RATE=""),
        transaction.atomic(),
    ):
        yield _build_world()
        transaction.set_rollback(True)


# --- the table covers every route -----------------------------------------------------------


def _api_routes():
    """(METHOD, route) of every /api/v1 view the resolver knows, routes spelled as in ROWS."""

    def walk(patterns, prefix):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                yield prefix + str(pattern.pattern), pattern.callback

    for route, view in walk(get_resolver().url_patterns, ""):
        if not route.startswith("api/v1/") or "(?P<format>" in route:
            continue
        route = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", route.removeprefix("api/v1/"))
        route = route.removeprefix("^").removesuffix("$").removesuffix("/?")
        if route in ("", "<drf_format_suffix:format>"):
            continue  # DRF's browsable root
        actions = getattr(view, "actions", None)
        cls = getattr(view, "cls", None) or getattr(view, "view_class", None)  # DRF, Django
        methods = actions or {
            m: m for m in cls.http_method_names if m not in ("options", "head") and hasattr(cls, m)
        }
        for method in methods:
            if method not in ("head", "options"):  # answered by Django/DRF for every GET
                yield method.upper(), route


def test_every_api_route_has_a_row():
    known = {(row.method, row.route) for row in ROWS}
    routes = set(_api_routes())
    assert routes - known == set(), "add a row to ROWS for each new route and method"
    assert known - routes == set(), "rows of routes that no longer exist"
    assert all(len(row.expected.split()) == len(ACTORS) for row in ROWS)


# --- each caller against every row -----------------------------------------------------------


def _visible_ids(world, actor, kind):
    """What each caller may list: its tenants' rows, all for operators, none for others."""
    rows = world.jobs if kind == "jobs" else world.leases
    if actor in ("member", "tenant_admin", "read_only"):
        return rows["vision"]
    if actor == "outsider":
        return rows["nlp"]
    if actor in ("operator", "support"):
        return rows["vision"] | rows["nlp"]
    if actor == "node" and kind == "leases":
        return rows["vision"] | rows["nlp"]  # every lease on this node
    return set()


def _check_list(world, actor, row, response):
    """Lists show exactly what the caller may see and count nothing else."""
    body = response.json()
    if row.route in ("jobs", "compute-leases"):
        kind = "jobs" if row.route == "jobs" else "leases"
        ids = {item["id"] for item in body["results"]}
        assert ids == _visible_ids(world, actor, kind), (row.route, actor)
        assert body["count"] == len(ids)
    elif row.route in ("tenants", "compute-leases/accounting"):
        items = body["results"] if row.route == "tenants" else body
        tenants = {item["slug" if row.route == "tenants" else "tenant"] for item in items}
        if actor in ("operator", "support", "policy_admin"):
            assert {"vision", "nlp"} <= tenants, (row.route, actor)
        elif actor == "shape_admin":  # defines shapes: sees no tenant
            assert tenants == set(), (row.route, actor)
        else:
            assert tenants == ({"nlp"} if actor == "outsider" else {"vision"}), (row.route, actor)
    elif row.route == "tokens":
        names = {item["name"] for item in body["results"]}
        assert ("spare" in names) == (actor in ("member", "read_only")), actor
        assert body["count"] == len(body["results"])


@pytest.mark.parametrize("actor", ACTORS)
def test_each_caller_gets_the_exact_status_on_every_route(world, actor, db):
    column = ACTORS.index(actor)
    client = world.client(actor)
    wrong = []
    for row in ROWS:
        expected = int(row.expected.split()[column])
        body = world.body(row.body) if isinstance(row.body, str) else row.body
        url = "/api/v1/" + row.url.format(w=world)
        if row.body == "enroll":  # signed by the key it binds, whoever holds the token
            client, body = _enrolling(client, body)
        with transaction.atomic():
            if body is None:
                response = client.generic(row.method, url)
            else:
                fmt = "multipart" if row.multipart else "json"
                response = getattr(client, row.method.lower())(url, body, format=fmt)
            is_list = row.method == "GET" and "{" not in row.route
            if response.status_code == expected == 200 and is_list:
                _check_list(world, actor, row, response)
            transaction.set_rollback(True)
        if response.status_code != expected:
            wrong.append(f"{row.method} {row.url}: {response.status_code} (not {expected})")
        if response.status_code == 404 and expected == 404:
            assert response.json()["code"] == "not_found"
    assert wrong == [], f"{actor}:\n" + "\n".join(wrong)


def _enrolling(client, body):
    """An enrollment as an agent sends it: the body names a new key and is signed by it; a
    node's client keeps its own signature (its credential is refused either way)."""
    key = NodeKey.generate()
    if not isinstance(client, SignedClient):
        signed = SignedClient(key)
        signed._credentials = dict(client._credentials)
        client = signed
    return client, body | {"public_key": key.public_key}


# --- node callbacks are checked against the lease and job they claim, fencing token included --


@pytest.mark.parametrize(
    ("url", "body"),
    [
        ("compute-leases/{w.reserved.pk}/commit", {}),
        ("compute-leases/{w.lease.pk}/renew", {}),
        ("compute-leases/{w.lease.pk}/release", {}),
        ("compute-leases/{w.lease.pk}/usage", {"cpu_millicores": 1, "memory_mib": 1}),
        ("agent/jobs/{w.job.pk}/report", {"step": "succeeded", "exit_code": 0}),
        ("agent/jobs/{w.job.pk}/logs", {"text": "x"}),
        ("agent/jobs/{w.job.pk}/checkpointed", {}),
    ],
)
def test_a_node_callback_needs_the_leases_own_fencing_token(world, db, url, body):
    agent = world.client("node")
    url = "/api/v1/" + url.format(w=world)
    with transaction.atomic():
        missing = agent.post(url, body, format="json")
        stale = agent.post(url, {**body, "fencing_token": "1"}, format="json")
        transaction.set_rollback(True)
    assert missing.status_code == 400 and "fencing_token" in missing.json()["errors"]
    assert stale.status_code == 409 and stale.json()["code"] == "fencing_token_mismatch"
    world.lease.refresh_from_db()
    assert world.lease.state == "committed" and world.lease.usage_reported_at is None


def test_another_nodes_token_does_not_open_this_nodes_lease(world, db):
    """The other node holding a lease of its own, with its own token: still 404 here."""
    other = world.client("other_node")
    token = {"fencing_token": str(world.lease.fencing_token)}  # even the right token
    for action in ("release", "usage", "renew"):
        body = token | ({"cpu_millicores": 1, "memory_mib": 1} if action == "usage" else {})
        url = f"/api/v1/compute-leases/{world.lease.pk}/{action}"
        with transaction.atomic():
            assert other.post(url, body, format="json").status_code == 404
            transaction.set_rollback(True)
