"""A network namespace of a test's own, joined to the host by a veth pair (`ip netns add` +
veth; iproute2): somewhere on this machine that is not the node's own address, for servers a
job may or may not reach and for clients of a job's published ports (Docker's userland proxy
shows loopback clients as the gateway, so only a client in its own namespace shows its source).

The pair takes a random /29 of 198.18.0.0/15 (the benchmarking range: neither private nor the
node's, so the address rules let a job reach it when its egress allows): the host side is
`.1`, the namespace's addresses `.2` and `.3`. Servers and client sockets are made in a thread
that entered the namespace (worker_agent.inputs.in_namespace), so they live there."""

from __future__ import annotations

import ipaddress
import os
import random
import secrets
import shutil
import socket
import socketserver
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from worker_agent.inputs import in_namespace

RANGE = ipaddress.ip_network("198.18.0.0/15")
PRIVATE = ipaddress.ip_network("10.254.0.0/16")


def stable_addresses() -> list:
    """This machine's addresses less those of the tests' own namespaces (their veths come and
    go while other tests run)."""
    from worker_agent.addresses import host_networks

    return [
        net.network_address
        for _, net in host_networks("")
        if not any(net.network_address in r for r in (RANGE, PRIVATE) if r.version == net.version)
    ]


def available() -> str | None:
    """Why namespaces of our own cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is missing"
    return None


class Server(ThreadingHTTPServer):
    """No reverse lookup of its own address at bind (HTTPServer's getfqdn): from inside the
    namespace the node's resolvers may be out of reach, and each lookup waits for a timeout."""

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=15)


class Netns:
    def __init__(self, private: bool = False):
        tag = secrets.token_hex(4)
        self.name, self.host_if, self.peer_if = f"cpt-{tag}", f"cph{tag}", f"cpn{tag}"
        subnet = random.SystemRandom().randrange(RANGE.num_addresses // 8)
        base = RANGE.network_address + subnet * 8
        self.host, self.address, self.other = (str(base + n) for n in (1, 2, 3))
        self.path = f"/run/netns/{self.name}"
        self.private = None  # with `private`, a /29 of 10.254.0.0/16 too: host .1, here .2
        private_base = PRIVATE.network_address + 8 * random.SystemRandom().randrange(
            PRIVATE.num_addresses // 8
        )
        self.servers: list[Server] = []
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.peer_if)
            _ip("link", "set", self.peer_if, "netns", self.name)
            _ip("addr", "add", f"{self.host}/29", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            inside = ("netns", "exec", self.name, "ip")
            for address in (self.address, self.other):
                _ip(*inside, "addr", "add", f"{address}/29", "dev", self.peer_if)
            _ip(*inside, "link", "set", self.peer_if, "up")
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "route", "add", "default", "via", self.host)
            if private:
                self.private = str(private_base + 2)
                _ip("addr", "add", f"{private_base + 1}/29", "dev", self.host_if)
                _ip(*inside, "addr", "add", f"{self.private}/29", "dev", self.peer_if)
        except BaseException:
            self.close()
            raise

    def serve(self, handler: type[BaseHTTPRequestHandler], address: str | None = None) -> int:
        """An HTTP server on a free port of `address` (default the namespace's first address)
        inside the namespace; its port."""
        server = in_namespace(self.path, lambda: Server((address or self.address, 0), handler))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers.append(server)
        return server.server_port

    def connect(self, host: str, port: int, source: str | None = None, timeout: float = 3):
        """A TCP connection from inside the namespace (from `source`); the socket, or the
        OSError it failed with."""

        def attempt():
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            sock.settimeout(timeout)
            try:
                if source:
                    sock.bind((source, 0))
                sock.connect((host, port))
                return sock
            except OSError as exc:
                sock.close()
                return exc

        return in_namespace(self.path, attempt)

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=15)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=15)
