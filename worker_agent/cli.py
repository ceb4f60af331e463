"""`python -m worker_agent --api URL --state-dir DIR [--enroll-token-file FILE]`.

Every flag has an environment variable (WORKER_AGENT_API, _CA_FILE, _ENROLL_TOKEN_FILE,
_STATE_DIR, _WORK_DIR, _RUNTIME, _PAUSE_IMAGE, _NODE_NAME, _POOL, _ADDRESS, _POLL_S, _LOG_LEVEL,
_LOG_FORMAT); a flag wins over its variable. The enrollment token itself is read from that file
or from WORKER_AGENT_ENROLL_TOKEN, never from the command line (which every user of the host can
read in the process list). One agent at a time holds a state dir (a lock in it): a second one
there exits. SIGTERM and SIGINT end the loops; containers keep running for the next agent to
reconcile.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from worker_agent import __version__, logs
from worker_agent.agent import Agent, AgentError, Config, EngineUnavailable
from worker_agent.client import ApiError, ApiUnreachable
from worker_agent.schema import InventoryInvalid
from worker_agent.state import AgentState, StateInUse

ENV = "WORKER_AGENT_"


def parser() -> argparse.ArgumentParser:
    def env(name, default=None):
        return os.environ.get(ENV + name, default)

    # no abbreviations: `--enroll-token T` must not pass for `--enroll-token-file`
    p = argparse.ArgumentParser(
        prog="worker_agent", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    p.add_argument("--api", default=env("API"), help="control plane URL (…/api/v1 implied)")
    p.add_argument(
        "--ca-file",
        default=env("CA_FILE", ""),
        help="CA bundle (PEM) that verifies the API's TLS certificate (default: the system's)",
    )
    p.add_argument(
        "--enroll-token-file",
        default=env("ENROLL_TOKEN_FILE"),
        help="file holding the cpe_… enrollment token (first start), or WORKER_AGENT_ENROLL_TOKEN",
    )
    p.add_argument("--state-dir", default=env("STATE_DIR"), help="the node credential")
    p.add_argument(
        "--key-file",
        default=env("KEY_FILE", ""),
        help="the node's private key, made on first start (default: <state dir>.key/node.key; "
        "never inside the state dir or the work dir)",
    )
    p.add_argument(
        "--rotate-key",
        action="store_true",
        help="replace the node's key with a new one (the control plane binds it), then exit",
    )
    p.add_argument(
        "--work-dir",
        default=env("WORK_DIR", ""),
        help="jobs' files (default: <state dir>.work; never inside the state dir)",
    )
    p.add_argument(
        "--runtime",
        default=env("RUNTIME", "auto"),
        choices=["auto", "docker", "process"],
        help="auto: Docker when an engine answers, else the local process runtime",
    )
    p.add_argument(
        "--pause-image",
        default=env("PAUSE_IMAGE", ""),
        help="the Docker runtime's network-owner image (needs `sleep`); required with Docker",
    )
    p.add_argument("--node-name", default=env("NODE_NAME", ""), help="default: the hostname")
    p.add_argument("--pool", default=env("POOL", ""), help="the pool expected (checked)")
    p.add_argument("--address", default=env("ADDRESS", ""), help="address in job routes")
    p.add_argument("--poll-s", type=float, default=float(env("POLL_S", "2")))
    p.add_argument(
        "--push",
        action=argparse.BooleanOptionalAction,
        default=env("PUSH", "1").lower() not in ("0", "false", "no"),
        help="long-poll for pushed assignments between polls (default: on)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(env("METRICS_PORT", "0")),
        help="serve the agent's own /metrics on this port (default 0: off)",
    )
    p.add_argument(
        "--metrics-address",
        default=env("METRICS_ADDRESS", "127.0.0.1"),
        help="the address /metrics listens on (default: loopback only)",
    )
    p.add_argument("--log-level", default=env("LOG_LEVEL", "INFO"))
    p.add_argument(
        "--log-format",
        default=env("LOG_FORMAT", "auto"),
        choices=logs.FORMATS,
        help="json: JSON lines; console: for people; auto: console on a terminal, else json",
    )
    p.add_argument("--version", action="version", version=__version__)
    return p


def enrollment_token(path: str | None) -> str:
    """The enrollment token: from the file when one is named, else WORKER_AGENT_ENROLL_TOKEN."""
    if path:
        return Path(path).read_text().strip()
    return os.environ.get(ENV + "ENROLL_TOKEN", "").strip()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)  # worker_agent/logs.py
    missing = [
        flag for flag, value in (("--api", args.api), ("--state-dir", args.state_dir)) if not value
    ]
    if missing:
        parser().error(
            f"{' and '.join(missing)} required (or {ENV}API / {ENV}STATE_DIR; docs/deployment.md)"
        )
    if args.ca_file and not os.access(args.ca_file, os.R_OK):
        parser().error(f"--ca-file {args.ca_file}: not a readable file")
    try:
        enroll_token = enrollment_token(args.enroll_token_file)
    except OSError as exc:
        parser().error(f"--enroll-token-file: {exc}")
    config = Config(
        api=args.api,
        ca_file=args.ca_file,
        state_dir=args.state_dir,
        work_dir=args.work_dir,
        enroll_token=enroll_token,
        runtime=args.runtime,
        pause_image=args.pause_image,
        node_name=args.node_name,
        pool=args.pool,
        address=args.address,
        poll_s=args.poll_s,
        push=args.push,
        metrics_port=args.metrics_port,
        metrics_address=args.metrics_address,
        key_file=args.key_file,
    )
    held = AgentState(args.state_dir)
    try:
        held.hold()  # until this process exits: before anything else touches the dir
        agent = Agent(config)
    except EngineUnavailable as exc:  # exit 1: its unit starts it again (2 it would not)
        logging.getLogger("worker_agent").error("%s: exiting to be restarted", exc)
        return 1
    except (AgentError, StateInUse) as exc:
        logging.getLogger("worker_agent").error("%s", exc)
        return 2

    def on_signal(signum, _frame):
        logging.getLogger("worker_agent").info("signal %s: stopping", signum)
        agent.stop()

    if args.rotate_key:
        try:
            agent.rotate_key()
        except (ApiError, ApiUnreachable, OSError) as exc:
            logging.getLogger("worker_agent").error("key rotation failed: %s", exc)
            return 1
        return 0

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.run()
    except (AgentError, InventoryInvalid, ApiUnreachable) as exc:
        logging.getLogger("worker_agent").error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
