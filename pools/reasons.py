"""The one catalogue of lifecycle reason codes, documented in docs/reason-codes.md.

Every event row carries one of these. Placement rejections (why a node was filtered out) have
their own catalogue in placement/reasons.py because the pure core cannot import Django.
"""

from django.db import models


class Reason(models.TextChoices):
    # generic
    CREATED = "created", "Created"
    OPERATOR_ACTION = "operator_action", "Operator action"
    # nodes
    ENROLLED = "enrolled", "Enrolled with a token"
    AGENT_AUTHENTICATED = "agent_authenticated", "Agent authenticated (private fleet)"
    PROBE_PASSED = "probe_passed", "Validation probe matched the claims"
    PROBE_MISMATCH = "probe_mismatch", "Validation probe contradicted the claims"
    # the GPU challenge's kernel (nodes/challenge.py): a validation probe quarantines with these,
    # a recovery probe keeps its device out with them
    GPU_CHALLENGE_WRONG = "gpu_challenge_wrong", "A GPU's challenge answer was wrong"
    GPU_CHALLENGE_SLOW = "gpu_challenge_slow", "A GPU was too slow for its claimed model"
    GPU_CHALLENGE_MISSING = "gpu_challenge_missing", "A claimed GPU gave no challenge answer"
    DRAIN_REQUESTED = "drain_requested", "Drain requested"
    DRAIN_COMPLETED = "drain_completed", "Drain completed"
    DRAIN_CANCELLED = "drain_cancelled", "Drain cancelled"
    QUARANTINED = "quarantined", "Quarantined"
    QUARANTINE_RELEASED = "quarantine_released", "Released from quarantine"
    INVENTORY_DRIFT = "inventory_drift", "Reported inventory drifted from registered"
    DISK_SHORT = "disk_short", "The node's disk holds less than its reservations"
    DISK_RECOVERED = "disk_recovered", "The node's disk holds its reservations again"
    NODE_UNREACHABLE = "node_unreachable", "Heartbeats missed"
    NODE_RETURNED = "node_returned", "Heartbeats resumed"
    RETIRED = "retired", "Retired"
    # leases
    RESERVED = "reserved", "Capacity reserved"
    COMMITTED = "committed", "Startup began; lease committed"
    RENEWED = "renewed", "Lease renewed"
    RELEASED_BY_CLIENT = "released_by_client", "Released by its holder"
    RELEASED_JOB_ENDED = "released_job_ended", "Released because the job ended"
    EXPIRED_UNCOMMITTED = "expired_uncommitted", "Not committed before expiry"
    EXPIRED_NOT_RENEWED = "expired_not_renewed", "Not renewed before expiry"
    NODE_SILENT = "node_silent", "The node's agent stopped answering"
    RECONCILED_RUNNING = "reconciled_running", "Reconciliation confirmed the workload runs"
    RECONCILED_GONE = "reconciled_gone", "Reconciliation confirmed the workload is gone"
    UNCERTAIN_DEADLINE = "uncertain_deadline", "Uncertain past its deadline"
    RESERVATION_UNCLAIMED = "reservation_unclaimed", "Reservation not claimed within tolerance"
    BACKFILL_WINDOW_CLOSED = "backfill_window_closed", "Backfill ended: the reservation was claimed"
    BACKFILL_ADOPTED = (
        "backfill_adopted",
        "Its reservation ended first: the backfill holds its own capacity on the node now",
    )
    LEASE_ENDED = "lease_ended", "Its lease has ended: the node's callbacks for it are refused"
    STOP_REQUESTED = "stop_requested", "Its job was cancelled; held until its container stops"
    STOP_CONFIRMED = "stop_confirmed", "The node's agent confirmed its container stopped"
    # jobs
    SUBMITTED = "submitted", "Submitted"
    PLACED = "placed", "Placed by the scheduler"
    PLAN_CONFLICT = "plan_conflict", "Its planned node was taken by another writer; next pass"
    CAPACITY_VANISHED = "capacity_vanished", "The node's capacity shrank under the job"
    IMAGE_INVALID = "image_invalid", "Image invalid: unreadable, missing or wrong architecture"
    IMAGE_NOT_ALLOWED = "image_not_allowed", "Image not from an allowed registry of the pool"
    IMAGE_SIGNATURE_INVALID = "image_signature_invalid", "Image not signed by a trusted key"
    IMAGE_PULL_FAILED = "image_pull_failed", "Image pull failed"
    STARTUP_BEGAN = "startup_began", "Container startup began"
    STARTUP_TIMED_OUT = "startup_timed_out", "Startup timed out"
    CONTAINER_STARTED = "container_started", "Container started"
    CHECKPOINT_REQUESTED = "checkpoint_requested", "Checkpoint requested"
    CHECKPOINT_DONE = "checkpoint_done", "Checkpoint written"
    CHECKPOINT_TIMED_OUT = "checkpoint_timed_out", "Checkpoint not reported in time; re-queued"
    EXITED_ZERO = "exited_zero", "Process exited with 0"
    EXITED_NONZERO = "exited_nonzero", "Process exited with a non-zero status"
    OOM_KILLED = "oom_killed", "Killed for exceeding its memory limit"
    CANCELLED_BY_USER = "cancelled_by_user", "Cancelled by user"
    PREEMPTED = "preempted", "Preempted for priority"
    PREEMPTING = "preempting", "Preempting lower-priority work; waits for its checkpoints"
    PREEMPTION_CALLED_OFF = (
        "preemption_called_off",
        "A preemption decided for the job was called off before its victims were signalled",
    )
    NODE_LOST = "node_lost", "Node lost"
    LEASE_EXPIRED = "lease_expired", "Its lease expired"
    REQUEUED = "requeued", "Returned to the queue"
    # jobs: the data plane (the worker agent's reports)
    IMAGE_PULLING = "image_pulling", "The agent is pulling the image"
    IMAGE_PULLED = "image_pulled", "The agent pulled the image"
    MAX_RUNTIME_EXCEEDED = "max_runtime_exceeded", "Killed at its maximum runtime"
    RUNTIME_ERROR = "runtime_error", "The container runtime failed to run it"
    RUNTIME_UNAVAILABLE = "runtime_unavailable", "The node does not offer the job's runtime"
    MPS_UNAVAILABLE = (
        "mps_unavailable",
        "The node's agent could not run the MPS daemon the job's share needs; nothing started",
    )
    GPU_MEMORY_SHARE_EXCEEDED = (
        "gpu_memory_share_exceeded",
        "An MPS share's job failed with a CUDA out-of-memory error at its memory cap",
    )
    SECRET_UNREADABLE = "secret_unreadable", "A secret of the job cannot be decrypted"
    RETRY_SCHEDULED = "retry_scheduled", "Failed or lost; queued again by its retry policy"
    ARTIFACTS_EXPIRED = "artifacts_expired", "Outputs and logs deleted after the pool's retention"
    OUTPUTS_SKIPPED = "outputs_skipped", "Files the job left were not uploaded (links, FIFOs …)"
    RESULTS_UPLOADED = "results_uploaded", "The agent uploaded the attempt's log and outputs"
    # persistent volumes (storage/, docs/storage.md "Persistent volumes")
    VOLUME_CREATED = "volume_created", "A tenant created a volume; its size is held on its node"
    VOLUME_ATTACHED = "volume_attached", "A job mounted the volume"
    VOLUME_DETACHED = "volume_detached", "A job that mounted the volume ended or left its node"
    VOLUME_DELETED = "volume_deleted", "Its tenant deleted the volume"
    VOLUME_EXPIRED = "volume_expired", "Detached past its retention; removed"
    VOLUME_DISK_RELEASED = "volume_disk_released", "Its node confirmed the image gone"
    VOLUME_EXPORT_REQUESTED = (
        "volume_export_requested",
        "Its tenant asked for a copy in a registered bucket (a job of the tenant)",
    )
    VOLUME_GONE = "volume_gone", "A volume the job mounts was deleted or expired before it began"
    # nodes: enrollment, probes, devices, drain deadlines, credentials
    PROBE_REQUESTED = "probe_requested", "Validation or recovery probe requested"
    PROBE_FAILED = "probe_failed", "Recovery probe failed; the device stays unschedulable"
    GPU_UNSUITABLE = "gpu_unsuitable", "A device became unsuitable and unschedulable"
    GPU_RECOVERED = "gpu_recovered", "A recovery probe passed; the device is schedulable again"
    # nodes: device health rules (nodes/health_rules.py), one per NVML reading: the rules a
    # device broke are in the data of its gpu_unsuitable / probe_failed event and its flags
    GPU_XID = "gpu_xid", "The device raised a critical Xid event"
    GPU_ECC_UNCORRECTED = "gpu_ecc_uncorrected", "Uncorrected ECC errors since the driver loaded"
    GPU_ECC_AGGREGATE_THRESHOLD = (
        "gpu_ecc_aggregate_threshold",
        "Uncorrected ECC errors over the device's life reached the threshold",
    )
    GPU_RETIRED_PAGES_PENDING = (
        "gpu_retired_pages_pending",
        "A page retirement or row remap waits for a GPU reset",
    )
    GPU_ROW_REMAP_FAILURE = (
        "gpu_row_remap_failure",
        "A row remap failed, or too many pages were retired",
    )
    GPU_TOO_HOT = "gpu_too_hot", "At or above its slowdown temperature"
    GPU_THROTTLED = "gpu_throttled", "Clocks slowed by the hardware (not idle, not a setting)"
    GPU_NVLINK_ERRORS = "gpu_nvlink_errors", "NVLink CRC/replay error rate or link recoveries"
    GPU_NVLINK_DOWN = "gpu_nvlink_down", "NVLinks of the device are down"
    GPU_PCIE_DEGRADED = "gpu_pcie_degraded", "PCIe link narrower than its maximum"
    GPU_HEALTH_CHECK_FAILED = "gpu_health_check_failed", "A device health check failed"
    # nodes, jobs: MIG instances (worker_agent/mig.py, docs/scheduler.md "MIG")
    MIG_PROFILE_MISMATCH = (
        "mig_profile_mismatch",
        "The MIG instance at the lease's slot is missing or has another profile",
    )
    MIG_LAYOUT_REQUESTED = (
        "mig_layout_requested",
        "The control plane asked the node for another MIG layout on an idle GPU",
    )
    DRAIN_DEADLINE = "drain_deadline", "The node's drain deadline passed"
    CREDENTIAL_ROTATED = "credential_rotated", "Node credential rotated"
    CREDENTIAL_REVOKED = "credential_revoked", "Node credential revoked"
    # node identity (docs/security.md "Node identity")
    NODE_KEY_BOUND = "node_key_bound", "Node key bound"
    NODE_KEY_ROTATED = "node_key_rotated", "Node key rotated"
    NODE_REENROLLED = "node_reenrolled", "Node enrolled again with its own key"
    IDENTITY_KEY_MISMATCH = "identity_key_mismatch", "Enrollment as a known node with another key"
    SIGNATURE_REFUSED = "signature_refused", "A request on the node's credential was refused"
    # tenants: an operator's support grant (reading a tenant's logs and outputs)
    SUPPORT_GRANTED = "support_granted", "A tenant admin granted an operator support access"
    SUPPORT_REVOKED = "support_revoked", "A tenant admin revoked a support grant"
    SUPPORT_EXPIRED = "support_expired", "A support grant reached its expiry"
    # tenants: membership (a MembershipEvent each)
    MEMBER_ADDED = "member_added", "A person was added to the tenant"
    MEMBER_ROLE_CHANGED = "member_role_changed", "A member's role in the tenant changed"
    MEMBER_REMOVED = "member_removed", "A member was removed from the tenant"
    # tenants: membership (a refusal, not an event)
    LAST_ADMIN = "last_admin", "The tenant's last admin cannot be removed or demoted"
    # tenants: registered buckets of an object store (a TenantBucketEvent each)
    BUCKET_REGISTERED = "bucket_registered", "A tenant admin registered a bucket"
    BUCKET_REMOVED = "bucket_removed", "A tenant admin removed a registered bucket"
    # jobs: inputs and outputs in a tenant's bucket
    INPUT_UNAVAILABLE = "input_unavailable", "An s3:// input's bucket is gone or unreadable"
    OUTPUT_MISMATCH = "output_mismatch", "The stored object is not the file announced (refusal)"
    OUTPUT_IN_OBJECT_STORE = (
        "output_in_object_store",
        "The output lives in the tenant's own bucket (refusal of a download)",
    )
    BUCKET_UNAVAILABLE = "bucket_unavailable", "The output destination's bucket is gone (refusal)"
    OBJECT_STORE_ERROR = "object_store_error", "The object store did not answer (refusal)"
    OUTPUT_PATH_MISMATCH = (
        "output_path_mismatch",
        "An upload by the other path than the job's output destination (refusal)",
    )
    # why a queued job waits (its `pending_reason` code, not an event; plan_conflict above)
    NO_CAPACITY = "no_capacity", "No node of the pool can hold it now"
    NO_READY_NODE = "no_ready_node", "It fits only on nodes that are not ready: it blocks no one"
    RESERVATION_WINDOW_NOT_OPEN = (
        "reservation_window_not_open",
        "It waits for the window of the reservation it names",
    )
    RESERVATION_BACKFILLS_STOPPING = (
        "reservation_backfills_stopping",
        "Its reservation's window is open, but a backfilled job's container may still run in it",
    )
    GANG_INCOMPLETE = "gang_incomplete", "Fewer members of its gang are queued than its size"
    GANG_MISMATCH = "gang_mismatch", "The members of its gang ask for different things"
    QUOTA_EXCEEDED = "quota_exceeded", "Its tenant's quota in the pool has no room for it"
    VOLUME_NODE_FULL = "volume_node_full", "The node its volume lives on has no room for it now"
    VOLUME_NODE_UNAVAILABLE = (
        "volume_node_unavailable",
        "The node its volume lives on is draining, quarantined, retired or unreachable",
    )
    VOLUME_IN_USE = "volume_in_use", "Another job mounts its volume read-write"
    CREDIT_EXHAUSTED = "credit_exhausted", "Its tenant's credit in the pool is used up"
    # robustness: one bad row never stops a pass or a sweep
    SCHEDULING_ERROR = "scheduling_error", "The scheduler could not process this job"
    SWEEP_FAILED = "sweep_failed", "A periodic sweep failed on this row; the others went on"


REASON_CODES = frozenset(Reason.values)  # `Reason.values` builds a new list on every access
