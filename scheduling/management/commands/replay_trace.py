"""Replay an OpenB GPU-cluster trace through the scheduler core.

    python manage.py replay_trace \
        --nodes ../shared/benchmarks/openb/data/openb_node_list_gpu_node.csv \
        --pods ../shared/benchmarks/openb/data/openb_pod_list_default.csv \
        --policy default --seeds 42-51 --tune 1.3 --json

``--variant NAME`` replays each seed's resample of the trace into a mix that is not given
(``scheduling.replay.variants``: cpu20, share100, ...). ``--pool SLUG`` instead of
``--policy`` replays the policy that pool places with (its newest version, read from the
database as the snapshot reads it); nothing else touches the database.
"""

import json
import sys
from dataclasses import replace

from django.core.management.base import BaseCommand, CommandError

from leases.snapshot import pool_policy
from pools.models import ComputePool
from scheduling.replay import POLICY_NAMES, VARIANTS, parse_seeds, replay


class Command(BaseCommand):
    help = "Replay a GPU-cluster trace (FGD paper protocol) and report GPU allocation."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--nodes", required=True, help="node CSV (sn,cpu_milli,...)")
        parser.add_argument("--pods", required=True, help="pod CSV (name,cpu_milli,...)")
        which = parser.add_mutually_exclusive_group()
        which.add_argument("--policy", choices=POLICY_NAMES, help="a named policy (default)")
        which.add_argument("--pool", help="the slug of a pool whose current policy to replay")
        parser.add_argument("--seeds", default="42-51", help="e.g. 42-51 or 42,43")
        parser.add_argument("--tune", type=float, default=1.3, help="target demand / capacity")
        parser.add_argument(
            "--variant", choices=tuple(VARIANTS), default="", help="a resampled mix of the trace"
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, **options):
        try:
            seeds = parse_seeds(options["seeds"])
        except ValueError as exc:
            raise CommandError(f"bad --seeds: {exc}") from exc
        if not seeds:
            raise CommandError("no seeds given")
        policy = options["policy"] or "default"
        if options["pool"]:
            policy = self.pool_policy(options["pool"])
        label = policy if isinstance(policy, str) else policy.name
        bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(total=len(seeds), desc=f"replay {label}", file=sys.stderr)
        try:
            result = replay(
                options["nodes"],
                options["pods"],
                policy,
                seeds,
                options["tune"],
                on_run=(lambda run: bar.update(1)) if bar else None,
                variant=options["variant"],
            )
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        finally:
            if bar:
                bar.close()
        if options["json"]:
            self.stdout.write(json.dumps(result))
            return
        at = result["alloc_at"]
        self.stdout.write(
            f"{result['trace']} {result['policy']} seeds={len(seeds)}: "
            f"alloc@100 {at['100']['mean']} (min {at['100']['min']}, max {at['100']['max']}), "
            f"alloc@130 {at['130']['mean']} (min {at['130']['min']}, max {at['130']['max']}), "
            f"{result['seconds_per_run']} s/run"
        )

    def pool_policy(self, slug: str):
        pool = ComputePool.objects.filter(slug=slug).first()
        if pool is None:
            raise CommandError(f"no pool {slug!r}")
        try:
            policy = pool_policy(pool)
        except ValueError as exc:
            raise CommandError(f"pool {slug!r}: {exc}") from exc
        return replace(policy, name=f"pool {slug} v{policy.version}")
