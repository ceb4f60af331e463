"""The nodes services: every write to a node goes through here. Callers use
`from nodes import services`; the modules:

- `lifecycle`: register (one, or a ready fleet at once), verify, ready, quarantine, release,
  retire, `node_transition`
- `drain`: draining, drain cancelled, drained (the work on a draining node is
  scheduling/drain.py's)
- `enrollment`: enrollment tokens and `node_enroll`
- `credentials`: node credentials: issue, rotate, reissue, revoke, look up
- `probes`: validation and recovery probes and their results
- `health`: device health from heartbeats
- `heartbeats`: heartbeat, unreachable, the heartbeat sweep
- `inventory`: inventory report, reconciliation on drift, its sweep
- `storage`: the disk and caches heartbeats report (scratch reconciled with the real disk)

A lifecycle change goes through `node_transition`; a change of a condition (reachability), of a
device's health, of capacity or of credentials writes a NodeEvent too, with from_state ==
to_state == the node's state, so the node's event list is the whole story of why it is where it
is. Sweeps take `now` and use guarded updates ("0 rows updated" means another worker did it);
each node of a sweep is handled in its own transaction (`pools.sweeps.sweep`). The pure rules
live beside the services: `nodes.capacity`, `nodes.inventory`, `nodes.claims`, `nodes.health_rules`.
"""

from ..errors import EnrollmentRefused, NodeScopeRefused
from .base import node_event
from .credentials import (
    CREDENTIAL_PREFIX,
    credential_for_secret,
    node_credential_issue,
    node_credential_reissue,
    node_credential_rotate,
    node_credentials_revoke,
)
from .drain import node_drain, node_drain_cancel, node_mark_drained
from .enrollment import (
    ENROLLMENT_PREFIX,
    enrollment_token_issue,
    enrollment_token_revoke,
    node_enroll,
)
from .health import gpu_health_apply, gpu_mark_unsuitable
from .heartbeats import (
    node_heartbeat,
    node_heartbeat_sweep,
    node_image_pull_record,
    node_mark_unreachable,
)
from .identity import node_key_bind, node_key_rotate, signature_refused
from .inventory import (
    inventory_reconcile_sweep,
    node_allocatable_lower,
    node_inventory_reconcile,
    node_inventory_report,
)
from .lifecycle import (
    node_mark_ready,
    node_quarantine,
    node_register,
    node_release,
    node_retire,
    node_transition,
    node_verify,
    nodes_register_ready,
)
from .probes import gpu_recover, probe_request, probe_result_submit
from .storage import (
    disk_ceiling_mib,
    node_cache_report,
    node_disk_ceiling,
    node_disk_report,
    node_downloads_record,
)

__all__ = [
    "CREDENTIAL_PREFIX",
    "ENROLLMENT_PREFIX",
    "EnrollmentRefused",
    "NodeScopeRefused",
    "credential_for_secret",
    "disk_ceiling_mib",
    "enrollment_token_issue",
    "enrollment_token_revoke",
    "gpu_health_apply",
    "gpu_mark_unsuitable",
    "gpu_recover",
    "inventory_reconcile_sweep",
    "node_allocatable_lower",
    "node_cache_report",
    "node_credential_issue",
    "node_credential_reissue",
    "node_credential_rotate",
    "node_credentials_revoke",
    "node_disk_ceiling",
    "node_disk_report",
    "node_downloads_record",
    "node_drain",
    "node_drain_cancel",
    "node_enroll",
    "node_event",
    "node_heartbeat",
    "node_heartbeat_sweep",
    "node_image_pull_record",
    "node_inventory_reconcile",
    "node_inventory_report",
    "node_key_bind",
    "node_key_rotate",
    "node_mark_drained",
    "node_mark_ready",
    "node_mark_unreachable",
    "node_quarantine",
    "node_register",
    "node_release",
    "node_retire",
    "node_transition",
    "node_verify",
    "nodes_register_ready",
    "probe_request",
    "probe_result_submit",
    "signature_refused",
]
