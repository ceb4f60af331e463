"""python manage.py drill --json [--bounded] [--seconds N] [--faults a,b] [--keep]

The product started as a fleet on this machine and broken while it works (issue 25;
config/drill/): its own PostgreSQL and Redis, two TLS web processes behind one balancer, two
Celery workers, one beat and three agents in network namespaces, under a mixed load, through
the faults one after another and a hostile burst; then ONE JSON object (requests by outcome,
p99 latency over the run and during each fault, jobs and leases by final state, the counts that
must be zero, each fault's time to recover). Exit status 1 when the verdict fails
(config/drill/run.py `failures`): a count that must be zero is not, a fault could not be done
or found the product wrong, a planned fault has no record, the hostile burst got anything but
a 4xx or skipped a probe, a process exited on its own, the engine watch broke, no job
succeeded, or the fleet left something behind. Needs root (namespaces, initdb as postgres), a
Docker engine and the loopback registry with the test image.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal

from django.core.management.base import BaseCommand, CommandError

from config.builders import TEST_IMAGE_TAG
from config.drill.faults import FAULTS
from config.drill.run import PROFILES, failures, run_drill
from config.management.commands.runstack import docker_answers, registry_answers

# --seconds: a run of at least a second, at most an hour (the fleet's logs, the load's samples)
SECONDS_MIN, SECONDS_MAX = 1.0, 3600.0


def _interrupt(*_):
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Start the product as a fleet on this machine, break it while it works, audit it."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
        parser.add_argument(
            "--bounded",
            action="store_true",
            help=f"the test suite's short drill (faults: {', '.join(PROFILES['bounded'].faults)})",
        )
        parser.add_argument(
            "--seconds",
            type=float,
            help="spread the faults over a run this long (at least; 1 to 3600)",
        )
        parser.add_argument("--faults", help=f"comma-separated, in order, of: {', '.join(FAULTS)}")
        parser.add_argument(
            "--keep", action="store_true", help="keep the work dir (every process's log)"
        )

    def handle(self, *args, **opts):
        faults = None
        if opts["faults"] is not None:
            faults = [name.strip() for name in opts["faults"].split(",") if name.strip()]
            if not faults:
                raise CommandError(
                    f"--faults names no fault (a drill that breaks nothing proves nothing); "
                    f"known: {', '.join(FAULTS)}"
                )
            unknown = [name for name in faults if name not in FAULTS]
            if unknown:
                raise CommandError(
                    f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}"
                )
        seconds = opts["seconds"]
        if seconds is not None and not (
            math.isfinite(seconds) and SECONDS_MIN <= seconds <= SECONDS_MAX
        ):
            raise CommandError(
                f"--seconds must be a number of seconds from {SECONDS_MIN:g} to "
                f"{SECONDS_MAX:g}, not {seconds!r}"
            )
        self.check_machine()
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            result = run_drill(
                profile="bounded" if opts["bounded"] else "full",
                faults=faults,
                seconds=opts["seconds"],
                keep=opts["keep"],
            )
        except KeyboardInterrupt:
            raise CommandError("interrupted: the fleet was stopped", returncode=130) from None
        self.stdout.write(json.dumps(result, indent=None if opts["json"] else 2))
        failed = failures(result)
        if failed:
            raise CommandError("the drill failed: " + "; ".join(failed))

    @staticmethod
    def check_machine() -> None:
        """What the drill needs, each missing piece named."""
        missing = []
        if os.geteuid() != 0:
            missing.append("root (network namespaces, PostgreSQL as the postgres user)")
        for tool in ("ip", "initdb", "pg_ctl", "redis-server", "runuser"):
            if shutil.which(tool) is None:
                missing.append(f"`{tool}` on PATH")
        if not docker_answers():
            missing.append("a Docker engine (the agents run jobs in containers)")
        elif registry_answers() != (True, True):
            missing.append(f"the loopback registry serving {TEST_IMAGE_TAG} (`make services`)")
        if missing:
            raise CommandError("the drill needs " + "; ".join(missing))
