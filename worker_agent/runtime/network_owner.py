"""The network owners of the Docker runtime's attempts (docs/data-plane.md, "Network policy").

A job with the pool network never owns its namespace: a small network-owner container (the
pause image, `sleep`) joins the bridge network `computepool` (inter-container traffic off) and
carries the published ports, bound to the pool's ingress address only; iptables rules are
installed in its namespace (worker_agent/netpolicy.py: egress, and ingress from the job's
`ingress_allow`) and only then is the job container created inside that namespace
(`container:<owner>`, no NET_ADMIN: it cannot change them). A node that cannot enforce this
(not root, no iptables/nsenter) fails such a job: runtime_error.

A job without a network fetches its inputs in a throwaway owner's namespace (`-inputs`) whose
egress allows only the inputs' hosts (worker_agent/inputs.py), removed once they are fetched.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
from pathlib import Path

from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from worker_agent import netpolicy
from worker_agent.runtime.base import LABEL, Assignment, RuntimeFailure
from worker_agent.runtime.container_spec import DIGEST_RE, HARDENED, json_logs
from worker_agent.runtime.engine import Engine, remove_container

log = logging.getLogger(__name__)

POOL_NETWORK = "computepool"
ROLE = f"{LABEL}.role"  # "network" on a network owner; job containers have no role label
OWNER_SUFFIX = "-net"
INPUTS_SUFFIX = "-inputs"  # the throwaway namespace a job without a network fetches inputs in


def is_network_owner(container) -> bool:
    return container.labels.get(ROLE) == "network"


class NetworkOwners:
    def __init__(self, engine: Engine, pause_image: str):
        # The owners' image (needs `sleep`; the job's own image may not have it), run pinned by
        # its digest.
        self.engine, self.pause_image = engine, pause_image

    def network_for(self, assignment: Assignment, refused) -> tuple[dict, int | None]:
        """The job container's network options. Mode none: no network. Otherwise the job joins
        its network owner's namespace, whose egress and ingress rules are installed before this
        returns (the job container is not created yet); with the owner's pid, where the inputs
        are fetched."""
        if assignment.network_mode == "none":
            if assignment.ports:
                log.warning("job %s: ports are not published with network none", assignment.job)
            return {"network_mode": "none"}, None
        problem = netpolicy.enforcement_problem()
        if problem:
            raise RuntimeFailure("runtime_error", str(netpolicy.unenforceable(problem)))
        pool = assignment.pool_network
        bounds = netpolicy.Bounds.of_pool(
            pool.egress_allowed, private_allowed=pool.private_ranges_allowed, refused=refused
        )
        name = self.engine.container_name(assignment) + OWNER_SUFFIX
        owner = self.start(assignment, name, assignment.ports)
        try:
            owner.reload()
            pid = int(owner.attrs["State"]["Pid"])
            allowed = netpolicy.enforce(
                pid,
                assignment.egress_allow,
                bounds,
                ports=assignment.ports,
                sources=assignment.ingress_allow,
            )
        except netpolicy.EgressError as exc:
            self.remove_of(owner.name)
            raise RuntimeFailure("runtime_error", str(exc)) from exc
        except BaseException:
            self.remove_of(owner.name)
            raise
        log.info("job %s: egress allowed to %s, all else dropped", assignment.job, allowed)
        return {"network_mode": f"container:{owner.id}"}, pid

    def fetch_inputs(self, assignment: Assignment, pid: int | None, fetcher) -> None:
        """In the job's own namespace (`pid`, its owner's), or for a job without a network in a
        throwaway owner's on the pool network whose egress allows only the inputs' hosts (under
        the same address rules), removed once they are fetched."""
        if pid is not None:
            fetcher.run(f"/proc/{pid}/ns/net")
            return
        problem = netpolicy.enforcement_problem()
        if problem:
            raise RuntimeFailure(
                "runtime_error", f"inputs cannot be fetched in a namespace of their own ({problem})"
            )
        bounds = netpolicy.Bounds(fetcher.rules.private_allowed, fetcher.rules.refused)
        name = self.engine.container_name(assignment) + INPUTS_SUFFIX
        owner = self.start(assignment, name, ())
        try:
            owner.reload()
            pid = int(owner.attrs["State"]["Pid"])
            netpolicy.enforce(pid, fetcher.hosts, bounds)
            fetcher.run(f"/proc/{pid}/ns/net")
        except netpolicy.EgressError as exc:
            raise RuntimeFailure("runtime_error", str(exc)) from exc
        finally:
            remove_container(owner)

    def pool_network(self) -> str:
        """The id of the bridge network every owner joins (inter-container traffic off), made
        once. Docker does not reliably refuse a second network of one name, so two agents on one
        engine starting together made two (and the name then resolves to neither): the agents of
        one host make it under a lock of the host's (`_host_lock`), and whatever duplicates are
        there anyway (an older agent's, another host's on a shared engine) are folded: each
        keeps the oldest, removes the others it can, and joins by id. (The fold alone was not
        enough: a network can be listed after one made later, so two agents kept different
        ones.)"""
        client = self.engine.client
        found = self._pool_networks()
        if not found:
            with _host_lock(f"computepool-network-{POOL_NETWORK}.lock"):
                found = self._pool_networks()  # another agent of this host made it meanwhile
                if not found:
                    client.networks.create(
                        POOL_NETWORK,
                        driver="bridge",
                        options={"com.docker.network.bridge.enable_icc": "false"},
                        labels={f"{LABEL}.network": "pool"},
                    )
                    found = self._pool_networks()
        kept, *extra = found
        for network in extra:  # one another agent joined stays (in use): nobody joins it again
            with contextlib.suppress(NotFound, APIError):
                client.api.remove_network(network["Id"])
        return kept["Id"]

    def _pool_networks(self) -> list[dict]:
        """The networks named exactly POOL_NETWORK (the engine's filter also matches parts of
        names), oldest first."""
        listed = self.engine.client.api.networks(names=[POOL_NETWORK])
        return sorted(
            (n for n in listed if n["Name"] == POOL_NETWORK), key=lambda n: (n["Created"], n["Id"])
        )

    def pinned_image(self) -> str:
        """The pause image by digest (pulled when missing); a tag is pinned to its digest."""
        ref, client = self.pause_image, self.engine.client
        try:
            image = client.images.get(ref)
        except ImageNotFound:
            try:
                image = client.images.pull(ref)
            except DockerException as exc:
                raise RuntimeFailure("runtime_error", f"pause image {ref}: {exc}") from exc
        if DIGEST_RE.match(ref):
            return ref
        repo = ref.rsplit(":", 1)[0] if ref.rfind(":") > ref.rfind("/") else ref
        for repo_digest in image.attrs.get("RepoDigests") or []:
            if repo_digest.partition("@")[0] == repo:
                return repo_digest
        raise RuntimeFailure("runtime_error", f"pause image {ref} has no registry digest")

    def start(self, assignment: Assignment, name: str, ports):
        """A network owner of the attempt: `sleep` on the pool network, hardened like a job,
        with tiny limits; the job's owner carries the published ports (the job shares its
        namespace), bound to the pool's ingress address only."""
        network = self.pool_network()
        image = self.pinned_image()
        sysctls = {}
        if Path("/proc/sys/net/ipv6").exists():
            sysctls = {
                "net.ipv6.conf.all.disable_ipv6": "1",
                "net.ipv6.conf.default.disable_ipv6": "1",
            }
        bind = assignment.pool_network.ingress_address
        try:
            return self.engine.client.containers.run(
                image,
                ["sleep", "2147483647"],
                name=name,
                detach=True,
                labels=self.engine.labels(assignment) | {ROLE: "network"},
                **HARDENED,
                mem_limit="16m",
                memswap_limit="16m",
                pids_limit=8,
                nano_cpus=100_000_000,
                network=network,
                sysctls=sysctls,
                ports={f"{port}/tcp": (bind, None) for port in ports},  # ephemeral host ports
                log_config=json_logs("1m", 1),
            )
        except DockerException as exc:
            self.engine.remove_ours(name)
            raise RuntimeFailure("runtime_error", f"network owner failed: {exc}") from exc

    def remove_of(self, name: str) -> None:
        """The network owner of job container `name` (or named so), if there is one of ours."""
        if not name.endswith(OWNER_SUFFIX):
            name += OWNER_SUFFIX
        owner = self.engine.get(name)
        if owner is not None and is_network_owner(owner) and self.engine.ours(owner):
            remove_container(owner)

    def of(self, container):
        """The network owner a job container shares (None: it has its own network)."""
        mode = (container.attrs.get("HostConfig") or {}).get("NetworkMode") or ""
        if not mode.startswith("container:"):
            return None
        owner = self.engine.get(mode.partition(":")[2])
        if owner is None or not is_network_owner(owner) or not self.engine.ours(owner):
            return None
        return owner

    def is_orphan(self, owner, job_names: set[str]) -> bool:
        """A network owner whose job container is gone (reconciliation removes it); a
        throwaway inputs namespace never outlives the create that made it."""
        job_name = owner.name.removesuffix(OWNER_SUFFIX)
        return owner.name.endswith(INPUTS_SUFFIX) or job_name not in job_names


# where the agents of one host find each other's lock (the unit's /tmp is not private, but
# /run/lock is the place for it)
LOCK_DIRS = ("/run/lock", tempfile.gettempdir())


@contextlib.contextmanager
def _host_lock(name: str):
    """An exclusive lock among this host's agents: flock on a file each opens for itself."""
    for folder in LOCK_DIRS:
        try:
            fd = os.open(os.path.join(folder, name), os.O_RDWR | os.O_CREAT, 0o600)
            break
        except OSError:
            continue
    else:  # nowhere to lock: the fold of duplicates above still applies
        log.warning("no lock file possible in %s: the pool network is made unlocked", LOCK_DIRS)
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
