"""What a node's events mean to the layers above (the lease ledger, the control loop), without
nodes importing them. Each is sent synchronously inside the sender's transaction, so a receiver's
writes commit or roll back with the node's own; a receiver that raises stops the sender.

The leases app connects its receivers in its AppConfig.ready() (leases/receivers.py), the
scheduling app its requests for a pass (scheduling/receivers.py).
"""

from django.dispatch import Signal

# Before a heartbeat writes anything of the node's: node, workloads (the agent's list of
# {"lease", "job", "state", "usage"}), now. A receiver raises nodes.errors.NodeScopeRefused for
# work that is not placed on the node, a ValidationError for usage out of bounds; the ledger's
# receiver then renews the running jobs' leases and records their usage.
workloads_reported = Signal()

# A node went silent: node, actor, now. A receiver returns the ids of the leases it made
# uncertain; the node's event counts them.
node_unreachable = Signal()

# An unreachable node heartbeats again: node, workloads, actor, now. Receivers reconcile what
# the node still runs with what it held.
node_returned = Signal()

# A node became ready (nodes.services.node_transition: verified, back from quarantine, a drain
# called off): node. Its capacity is schedulable once the transaction commits; the control loop
# asks for a pass of its pool then (scheduling/receivers.py).
node_ready = Signal()

# The node's reported capacity shrank under what its leases hold (nodes.services.inventory:
# the reconciliation): node, shortfall ({"cpu_millicores"|"memory_mib"|"scratch_mib": how much
# more its leases hold than it now has}), gpus (ids of its devices that vanished), allocatable
# ({"<dimension>_allocatable": what the node reported} of the short dimensions), inventory (the
# registered inventory it was computed for), actor, now. Unlike the others it is sent AFTER the
# reconciliation committed, outside the node's row lock: the allocatable is capped at what the
# leases hold meanwhile. The jobs app ends the attempts that lost their capacity
# (`capacity_vanished`, jobs/receivers.py), each in its own transaction in the usual lock order
# (job → lease → node), lowering the allocatable (node_allocatable_lower) in the same commit;
# the sender then lowers it to what its leases still hold, and asks again while still short.
capacity_vanished = Signal()
