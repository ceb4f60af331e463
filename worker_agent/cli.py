"""`python -m worker_agent --api URL --enroll-token T --state-dir DIR`.

Every flag has an environment variable (WORKER_AGENT_API, _ENROLL_TOKEN, _STATE_DIR, _RUNTIME,
_NODE_NAME, _POOL, _ADDRESS, _POLL_S, _LOG_LEVEL); a flag wins over its variable. SIGTERM and
SIGINT end the loops; containers keep running for the next agent to reconcile.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from worker_agent import __version__
from worker_agent.agent import Agent, AgentError, Config
from worker_agent.client import ApiUnreachable
from worker_agent.schema import InventoryInvalid

ENV = "WORKER_AGENT_"


def parser() -> argparse.ArgumentParser:
    def env(name, default=None):
        return os.environ.get(ENV + name, default)

    p = argparse.ArgumentParser(prog="worker_agent", description=__doc__.splitlines()[0])
    p.add_argument("--api", default=env("API"), help="control plane URL (…/api/v1 implied)")
    p.add_argument("--enroll-token", default=env("ENROLL_TOKEN", ""), help="cpe_… (first start)")
    p.add_argument("--state-dir", default=env("STATE_DIR"), help="credential and attempts")
    p.add_argument(
        "--runtime",
        default=env("RUNTIME", "auto"),
        choices=["auto", "docker", "process"],
        help="auto: Docker when an engine answers, else the local process runtime",
    )
    p.add_argument("--node-name", default=env("NODE_NAME", ""), help="default: the hostname")
    p.add_argument("--pool", default=env("POOL", ""), help="the pool expected (checked)")
    p.add_argument("--address", default=env("ADDRESS", ""), help="address in job routes")
    p.add_argument("--poll-s", type=float, default=float(env("POLL_S", "2")))
    p.add_argument("--log-level", default=env("LOG_LEVEL", "INFO"))
    p.add_argument("--version", action="version", version=__version__)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    missing = [
        flag for flag, value in (("--api", args.api), ("--state-dir", args.state_dir)) if not value
    ]
    if missing:
        parser().error(f"{' and '.join(missing)} required (or {ENV}API / {ENV}STATE_DIR)")
    config = Config(
        api=args.api,
        state_dir=args.state_dir,
        enroll_token=args.enroll_token,
        runtime=args.runtime,
        node_name=args.node_name,
        pool=args.pool,
        address=args.address,
        poll_s=args.poll_s,
    )
    try:
        agent = Agent(config)
    except AgentError as exc:
        logging.getLogger("worker_agent").error("%s", exc)
        return 2

    def on_signal(signum, _frame):
        logging.getLogger("worker_agent").info("signal %s: stopping", signum)
        agent.stop()

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
