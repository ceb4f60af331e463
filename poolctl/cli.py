"""`poolctl`: the command line (argparse) and its exit codes.

    0  done
    1  usage or configuration error (bad flags, no token, an unreadable manifest): nothing sent
    2  the API refused the request (4xx): its reason code is printed
    3  the server failed (5xx) or could not be reached
    4  `watch`: the job ended without succeeding (failed, cancelled, lost)

argparse rather than click: one more dependency is not needed for a dozen subcommands, and
click answers a usage error with exit code 2, which here means "the API refused".
"""

from __future__ import annotations

import argparse
import sys

import requests

from poolctl import __version__, commands
from poolctl import config as configuration
from poolctl.client import ApiRefused, Client, ServerError
from poolctl.config import UsageError

USAGE_ERROR = 1


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would exit 2: here 2 is the API's refusal
        self.print_usage(sys.stderr)
        raise UsageError(message)


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def _resource_flags(parser) -> None:
    group = parser.add_argument_group("inline resources (instead of --shape)")
    group.add_argument("--cpu", type=int, metavar="MILLICORES", help="CPU, e.g. 500 = half a core")
    group.add_argument("--memory", type=int, metavar="MIB", help="memory in MiB")
    group.add_argument("--scratch", type=int, metavar="MIB", help="scratch disk in MiB")
    group.add_argument("--gpus", type=int, metavar="N", help="GPU count")
    group.add_argument(
        "--gpu-sharing",
        metavar="CLASS",
        help="exclusive (default with --gpus), mig, timeslice, mps",
    )
    group.add_argument("--gpu-milli", type=int, metavar="N", help="share of a GPU, 1..999")
    group.add_argument("--mig-profile", metavar="PROFILE", help="e.g. 1g.10gb")
    group.add_argument("--gpu-model", action="append", metavar="MODEL", help="repeatable")
    group.add_argument("--gpus-preferred", type=int, metavar="N", help="more GPUs when there are")
    group.add_argument("--gpu-memory", type=int, metavar="MIB", help="GPU memory minimum")
    group.add_argument("--gpu-memory-preferred", type=int, metavar="MIB")
    group.add_argument("--gpu-driver-min", metavar="VERSION", help="e.g. 535.104")
    group.add_argument("--cuda-min", metavar="VERSION", help="e.g. 12.2")
    group.add_argument(
        "--compute-capability-min", metavar="MAJOR.MINOR", help="GPU compute capability, e.g. 8.0"
    )
    group.add_argument(
        "--gpu-interconnect", action="store_true", help="GPUs in one NVLink/NVSwitch group"
    )
    group.add_argument("--region", action="append", metavar="REGION", help="allowed; repeatable")
    group.add_argument("--region-preferred", action="append", metavar="REGION")
    group.add_argument("--zone", action="append", metavar="ZONE", help="allowed; repeatable")
    group.add_argument("--zone-preferred", action="append", metavar="ZONE")
    group.add_argument(
        "--node-feature",
        action="append",
        metavar="FEATURE",
        help="a feature the node must have, e.g. avx512; repeatable",
    )
    group.add_argument(
        "--warm-image", action="store_true", help="only nodes that already hold the image"
    )
    group.add_argument("--trust-level-min", type=int, metavar="N")


def build_parser() -> Parser:
    common = Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="the API's JSON, for scripts")

    parser = Parser(
        prog="poolctl",
        description="The Compute Pool command line: jobs, leases, shapes and quotas over the "
        "public API. Configure with POOLCTL_URL and POOLCTL_TOKEN (or "
        "~/.config/poolctl/config.toml). Exit codes: 0 ok, 1 usage/config, 2 refused by the "
        "API, 3 server or network, 4 watched job did not succeed.",
    )
    parser.add_argument("--version", action="version", version=f"poolctl {__version__}")
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)

    def command(name, handler, help_text, **kwargs):
        cmd = sub.add_parser(
            name, parents=[common], help=help_text, description=help_text, **kwargs
        )
        cmd.set_defaults(handler=handler)
        return cmd

    cmd = command("submit", commands.submit, "submit a job from flags and/or a manifest")
    cmd.add_argument("-f", "--file", metavar="MANIFEST", help="YAML or JSON job body ('-': stdin)")
    cmd.add_argument("--tenant", help="default: POOLCTL_TENANT, else your only tenant")
    cmd.add_argument("--pool", help="default: POOLCTL_POOL")
    cmd.add_argument("--name")
    cmd.add_argument("--image")
    cmd.add_argument("--shape", help="a catalogue shape of the pool (see `poolctl shapes`)")
    cmd.add_argument("--env", action="append", metavar="KEY=VALUE", help="repeatable")
    cmd.add_argument("--label", action="append", metavar="KEY=VALUE", help="repeatable")
    cmd.add_argument(
        "--affinity", action="append", metavar="KEY=VALUE", help="node label required; repeatable"
    )
    cmd.add_argument(
        "--affinity-preferred",
        action="append",
        metavar="KEY=VALUE",
        help="node label preferred; repeatable",
    )
    cmd.add_argument(
        "--anti-affinity",
        action="append",
        metavar="KEY=VALUE",
        help="avoid nodes running work with this label; repeatable",
    )
    cmd.add_argument(
        "--anti-affinity-scope",
        choices=("host", "zone"),
        help="where --anti-affinity looks: the node (host, the default) or its whole zone",
    )
    cmd.add_argument("--priority-class", metavar="NAME")
    cmd.add_argument("--max-runtime", type=int, metavar="SECONDS")
    cmd.add_argument("--checkpointable", action="store_true")
    cmd.add_argument(
        "--reservation",
        type=int,
        metavar="LEASE",
        help="a reservation of the tenant (a lease made with --start/--end): the job runs on it "
        "once its window opens",
    )
    cmd.add_argument(
        "--volume",
        action="append",
        metavar="ID:/PATH[:ro]",
        help="mount one of your persistent volumes (see `poolctl volumes`); repeatable",
    )
    cmd.add_argument("-q", "--quiet", action="store_true", help="print only the job's id")
    cmd.add_argument("command", nargs="*", help="the command, after --: -- sh -c 'echo hi'")
    _resource_flags(cmd)

    cmd = command("jobs", commands.jobs, "list jobs, or show one")
    cmd.add_argument("job", nargs="?", type=int, metavar="JOB")
    cmd.add_argument("--state", help="a state or several: queued,running")
    cmd.add_argument("--pool")
    cmd.add_argument("--tenant")
    cmd.add_argument("--limit", type=int, default=50, help="at most this many (0: all)")

    cmd = command("watch", commands.watch, "follow a job's events until it ends (exit 4: "
                  "it did not succeed)")  # fmt: skip
    cmd.add_argument("job", type=int, metavar="JOB")
    cmd.add_argument("--interval", type=_positive_float, default=2.0, metavar="SECONDS")

    cmd = command("events", commands.events, "a job's events so far")
    cmd.add_argument("job", type=int, metavar="JOB")

    cmd = command("logs", commands.logs, "a job's log (-f: follow it until the job ends)")
    cmd.add_argument("job", type=int, metavar="JOB")
    cmd.add_argument("--tail", type=int, default=1000, metavar="LINES", help="1..10000")
    cmd.add_argument("-f", "--follow", action="store_true")
    cmd.add_argument("--interval", type=_positive_float, default=2.0, metavar="SECONDS")

    cmd = command("outputs", commands.outputs, "a job's output files, or --get one")
    cmd.add_argument("job", type=int, metavar="JOB")
    cmd.add_argument("--get", metavar="NAME", help="download this output")
    cmd.add_argument("-o", "--output", metavar="PATH", help="where to (default: NAME; '-': stdout)")
    cmd.add_argument("--force", action="store_true", help="replace an existing file")

    cmd = command("cancel", commands.cancel, "cancel a job")
    cmd.add_argument("job", type=int, metavar="JOB")

    cmd = command("explain", commands.explain, "why a job waits (the scheduler's explanation)")
    cmd.add_argument("job", type=int, metavar="JOB")

    command("pools", commands.pools, "the pools you may use")

    cmd = command("shapes", commands.shapes, "resource shapes, of one pool or all")
    cmd.add_argument("pool", nargs="?", metavar="POOL", help="a pool's slug or id")

    cmd = command("quota", commands.quota, "your tenants' quotas, usage and credit")
    cmd.add_argument("--tenant")
    cmd.add_argument("--pool")

    _lease_commands(sub, common)
    _volume_commands(sub, common)
    return parser


def _volume_commands(sub, common) -> None:
    volumes = sub.add_parser(
        "volumes", parents=[common], help="list your volumes; show, create, delete, export one"
    )
    volumes.set_defaults(handler=commands.volumes)  # no ACTION: the list
    volumes.add_argument("--state")
    volumes.add_argument("--pool")
    volumes.add_argument("--tenant")
    volumes.add_argument("--limit", type=int, default=50, help="at most this many (0: all)")
    actions = volumes.add_subparsers(dest="volume_action", metavar="ACTION")

    def action(name, handler, help_text):
        cmd = actions.add_parser(name, parents=[common], help=help_text, description=help_text)
        cmd.set_defaults(handler=handler)
        return cmd

    for name, handler, help_text in (
        ("show", commands.volume_show, "one volume (where it is, whether it is at risk)"),
        ("delete", commands.volume_delete, "delete a volume no unfinished job mounts"),
        ("events", commands.volume_events, "a volume's events"),
    ):
        cmd = action(name, handler, help_text)
        cmd.add_argument("volume", type=int, metavar="VOLUME")

    cmd = action("create", commands.volume_create, "create a volume on a node's disk")
    cmd.add_argument("--tenant", help="default: POOLCTL_TENANT, else your only tenant")
    cmd.add_argument("--pool", help="default: POOLCTL_POOL")
    cmd.add_argument("--name", required=True)
    cmd.add_argument("--size", type=int, required=True, metavar="MiB")
    cmd.add_argument("--node", help="on this node")
    cmd.add_argument("--zone", help="on a node of this zone")
    cmd.add_argument("--retention-days", type=int, metavar="DAYS")

    cmd = action("export", commands.volume_export, "copy a volume to your registered bucket")
    cmd.add_argument("volume", type=int, metavar="VOLUME")
    cmd.add_argument("--destination", required=True, metavar="s3://BUCKET/PREFIX/")


def _lease_commands(sub, common) -> None:
    leases = sub.add_parser(
        "leases", parents=[common], help="list leases; show, reserve, commit, renew, release one"
    )
    leases.set_defaults(handler=commands.leases)  # no ACTION: the list
    leases.add_argument("--state")
    leases.add_argument("--pool")
    leases.add_argument("--tenant")
    leases.add_argument("--limit", type=int, default=50, help="at most this many (0: all)")
    actions = leases.add_subparsers(dest="lease_action", metavar="ACTION")

    def action(name, handler, help_text):
        cmd = actions.add_parser(name, parents=[common], help=help_text, description=help_text)
        cmd.set_defaults(handler=handler)
        return cmd

    cmd = action("show", commands.lease_show, "one lease")
    cmd.add_argument("lease", type=int, metavar="LEASE")

    cmd = action("reserve", commands.lease_reserve, "reserve capacity (prints the fencing token)")
    cmd.add_argument("--tenant", help="default: POOLCTL_TENANT, else your only tenant")
    cmd.add_argument("--pool", help="default: POOLCTL_POOL")
    cmd.add_argument("--shape")
    cmd.add_argument("--duration", type=int, metavar="SECONDS", help="default: the server's TTL")
    cmd.add_argument("--idempotency-key", metavar="KEY", help="a retry returns the same lease")
    cmd.add_argument("--start", metavar="ISO-8601", help="a reservation's window opens then")
    cmd.add_argument("--end", metavar="ISO-8601", help="… and ends then (with --start)")
    cmd.add_argument(
        "--tolerance", type=int, metavar="SECONDS", help="claim it within this of --start"
    )
    _resource_flags(cmd)

    for name, handler, help_text in (
        ("commit", commands.lease_commit, "commit a reserved lease"),
        ("renew", commands.lease_renew, "push a lease's expiry out"),
    ):
        cmd = action(name, handler, help_text)
        cmd.add_argument("lease", type=int, metavar="LEASE")
        cmd.add_argument("--fencing-token", dest="fencing", required=True, metavar="TOKEN")
        if name == "renew":
            cmd.add_argument("--duration", type=int, metavar="SECONDS")

    cmd = action("release", commands.lease_release, "release a lease (idempotent)")
    cmd.add_argument("lease", type=int, metavar="LEASE")
    cmd.add_argument("--message", default="", help="why, kept on the lease's event")

    cmd = action("events", commands.lease_events, "a lease's events")
    cmd.add_argument("lease", type=int, metavar="LEASE")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(f"poolctl: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    try:
        client = Client(configuration.load())
        return args.handler(client, args)
    except UsageError as exc:  # a ConfigError too
        print(f"poolctl: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except (ApiRefused, ServerError) as exc:
        print(f"poolctl: {exc}", file=sys.stderr)
        return exc.exit_code
    except requests.RequestException as exc:  # a download cut off half way, say
        print(f"poolctl: {ServerError(exc)}", file=sys.stderr)
        return ServerError.exit_code
    except KeyboardInterrupt:
        return 130  # the shell's convention for Ctrl-C


if __name__ == "__main__":
    sys.exit(main())
