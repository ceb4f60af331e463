"""`python manage.py role web|worker|beat …`: one process of a fleet (docs/deployment.md).

It refuses to start (exit 2, one line naming every missing setting) unless the settings the role
needs are set in its environment (config/roles.py REQUIRED_SETTINGS): the built-in defaults only
suit `make run` on one machine. Then it execs the server in its place (os.execv): the process a
supervisor started is the server itself, so its signals reach the server (SIGTERM: a clean
stop) and its exit status is the server's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from config import roles

DOCS = "docs/deployment.md, 'Settings per role'"
HOST = re.compile(r"[0-9a-fA-F:.]+|[A-Za-z0-9.-]+")


class Command(BaseCommand):
    help = "Run one role of the fleet in this process: web, worker or beat."
    requires_system_checks = []  # the server runs its own; this only execs it

    def add_arguments(self, parser):
        roles_ = parser.add_subparsers(dest="role", required=True, metavar="web|worker|beat")
        web = roles_.add_parser("web", help="the ASGI server (HTTP API, console, websockets)")
        web.add_argument("--bind", default="127.0.0.1:8000", help="HOST:PORT ([v6]:PORT)")
        # from the environment too, so one systemd unit serves with or without TLS
        web.add_argument("--certfile", default=os.environ.get("WEB_CERTFILE", ""))
        web.add_argument("--keyfile", default=os.environ.get("WEB_KEYFILE", ""))
        worker = roles_.add_parser("worker", help="a Celery worker (passes and sweeps), no beat")
        worker.add_argument("--concurrency", type=int, default=2)
        worker.add_argument("--hostname", default=None, help="its Celery name: NAME@HOST")
        beat = roles_.add_parser("beat", help="Celery beat alone (one leader at a time)")
        beat.add_argument("--schedule", default=None, help="the file of its last run times")

    def handle(self, *args, role, **options):
        missing = roles.missing_settings(role)
        if missing:
            raise CommandError(
                f"role {role} refuses to start: set {', '.join(missing)} in its environment "
                f"({DOCS})",
                returncode=2,
            )
        wrong = roles.unusable_settings(role)
        if wrong:
            raise CommandError(f"role {role} refuses to start: {'; '.join(wrong)}", returncode=2)
        command = getattr(self, f"{role}_command")(**options)
        os.execv(command[0], command)

    def web_command(self, *, bind, certfile, keyfile, **_):
        host, _colon, port = bind.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")  # an IPv6 address, bracketed or not
        if not (HOST.fullmatch(host) and port.isascii() and port.isdigit()):
            raise CommandError(f"--bind {bind!r}: expected HOST:PORT", returncode=2)
        if not 1 <= int(port) <= 65535:
            raise CommandError(f"--bind {bind!r}: a port is 1 to 65535", returncode=2)
        if bool(certfile) != bool(keyfile):
            raise CommandError("TLS needs both --certfile and --keyfile", returncode=2)
        for flag, path in (("--certfile", certfile), ("--keyfile", keyfile)):
            if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
                raise CommandError(f"{flag} {path}: not a readable file", returncode=2)
        return roles.web_command(roles.bind_address(host, int(port)), certfile, keyfile)

    def worker_command(self, *, concurrency, hostname, **_):
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1", returncode=2)
        return roles.worker_command(concurrency, hostname)

    def beat_command(self, *, schedule, **_):
        if not schedule:  # the checkout's var/, as `make run` makes it
            schedule = roles.DEFAULT_BEAT_SCHEDULE
            schedule.parent.mkdir(exist_ok=True)
        schedule = Path(schedule)
        if not schedule.parent.is_dir():
            raise CommandError(f"--schedule {schedule}: no such directory", returncode=2)
        if schedule.is_dir():
            raise CommandError(f"--schedule {schedule}: a directory, not a file", returncode=2)
        return roles.beat_command(schedule)
