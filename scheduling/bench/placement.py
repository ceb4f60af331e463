"""Placement-quality benchmark: replay the OpenB traces and compare with the published results.

    python -m scheduling.bench.placement [--quick | --robust] [--jobs N] [--markdown]

Prints one JSON object. Every policy is replayed in this same run, so the comparison of the
product default with FGD (``default_minus_fgd``) is measured side by side on the same machine
and seeds; ``published`` comes from ``../shared/benchmarks/openb/reference_results.csv``.
``--robust``: the default and FGD only, on every given trace and every variant of
``scheduling.replay.variants`` (mixes that are not given), the protocol's ten seeds 42-51
(the allocation at arrival 100 of a mix with many model-pinned tasks moves by up to a point
from seed to seed, so three seeds cannot tell a 0.2-point difference).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from scheduling.replay import (
    POLICY_NAMES,
    VARIANTS,
    make_variant,
    read_nodes,
    read_pods,
    replay_run,
    summarize,
)

OPENB = Path(__file__).resolve().parents[2].parent / "shared" / "benchmarks" / "openb"
REFERENCE_NAMES = {
    "random": "Random",
    "dotprod": "DotProd",
    "gpu-clustering": "GpuClustering",
    "gpu-packing": "GpuPacking",
    "best-fit": "BestFit",
    "fgd": "FGD",
}
DEFAULT_TRACE = "openb_pod_list_default"
SEEDS = (42, 43, 44)


def traces(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "data").glob("openb_pod_list_*.csv"))


def published(root: Path) -> dict[tuple[str, str], dict]:
    with open(root / "reference_results.csv", newline="") as handle:
        return {(row["workload"], row["policy"]): row for row in csv.DictReader(handle)}


def _run(job):
    root, trace, variant, policy, seed = job
    nodes = read_nodes(str(root / "data" / "openb_node_list_gpu_node.csv"))
    pods = read_pods(str(root / "data" / f"{trace}.csv"))
    if variant:
        pods = make_variant(pods, variant, seed)
    run = replay_run(nodes, pods, policy, seed)
    run.events = []  # keep the pickled result small
    return variant or trace, policy, run


def plan(root: Path, quick: bool, robust: bool = False) -> list[tuple]:
    if quick:
        return [(root, DEFAULT_TRACE, "", p, s) for p in ("fgd", "default") for s in (42, 43)]
    if robust:
        mixes = [(t, "") for t in traces(root)] + [(v.base, v.name) for v in VARIANTS.values()]
        seeds = range(42, 52)
        return [(root, t, v, p, s) for t, v in mixes for p in ("fgd", "default") for s in seeds]
    jobs = []
    for trace in traces(root):
        seeds = range(42, 52) if trace == DEFAULT_TRACE else SEEDS
        jobs += [(root, trace, "", p, s) for p in POLICY_NAMES for s in seeds]
    return jobs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="default trace, fgd vs default")
    parser.add_argument(
        "--robust", action="store_true", help="default vs fgd on every trace and variant"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--openb", default=str(OPENB), help="benchmark folder")
    parser.add_argument("--markdown", action="store_true", help="print a table, not JSON")
    parser.add_argument("--from-json", help="render the table of an earlier JSON output")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as handle:
            saved = json.load(handle)
        table = robust_table if saved.get("robust") else markdown_table
        print(table(saved["results"]))
        return 0
    root = Path(args.openb)
    jobs = plan(root, args.quick, args.robust)
    runs: dict[tuple[str, str], list] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for done, (trace, policy, run) in enumerate(pool.map(_run, jobs), 1):
            runs.setdefault((trace, policy), []).append(run)
            if sys.stderr.isatty():
                print(f"\r{done}/{len(jobs)} runs", end="", file=sys.stderr)
    reference = published(root)
    results = []
    for (trace, policy), trace_runs in sorted(runs.items()):
        summary = summarize(trace, policy, trace_runs)
        row = {
            "trace": trace,
            "policy": policy,
            "seeds": summary["seeds"],
            "alloc_at": summary["alloc_at"],
            "failed_pods_mean": sum(r.failed_pods for r in trace_runs) / len(trace_runs),
            "by_seed": {str(r.seed): [r.curve.get(100), r.curve.get(130)] for r in trace_runs},
            "seconds_per_run": summary["seconds_per_run"],
        }
        ref = reference.get((trace, REFERENCE_NAMES.get(policy, "FGD")))
        if ref:
            row["published"] = {
                "policy": ref["policy"],
                "100": float(ref["alloc_at_100_mean"]),
                "130": float(ref["alloc_at_130_mean"]),
            }
            row["delta_vs_published"] = {
                x: round(summary["alloc_at"][x]["mean"] - row["published"][x], 3)
                for x in ("100", "130")
            }
        results.append(row)
    by_key = {(r["trace"], r["policy"]): r for r in results}
    comparison = {}
    for (trace, policy), row in by_key.items():
        fgd = by_key.get((trace, "fgd"))
        if policy == "default" and fgd:
            comparison[trace] = {
                x: round(row["alloc_at"][x]["mean"] - fgd["alloc_at"][x]["mean"], 3)
                for x in ("100", "130")
            }
    if args.markdown:
        print((robust_table if args.robust else markdown_table)(results))
    else:
        out = {"results": results, "default_minus_fgd": comparison, "robust": args.robust}
        print(json.dumps(out, indent=1))
    return 0


def markdown_table(results: list[dict]) -> str:
    lines = [
        "| trace | policy | seeds | mean @100 (min–max) | published @100 | mean @130 (min–max) "
        "| published @130 | s/run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    order = {name: i for i, name in enumerate(POLICY_NAMES)}
    for row in sorted(results, key=lambda r: (r["trace"], order.get(r["policy"], 99))):
        at, ref = row["alloc_at"], row.get("published", {})
        cells = [
            row["trace"].removeprefix("openb_pod_list_"),
            row["policy"] + (f" (vs {ref['policy']})" if row["policy"] == "default" else ""),
            f"{len(row['seeds'])}",
            f"{at['100']['mean']:.2f} ({at['100']['min']:.2f}–{at['100']['max']:.2f})",
            f"{ref.get('100', float('nan')):.2f}",
            f"{at['130']['mean']:.2f} ({at['130']['min']:.2f}–{at['130']['max']:.2f})",
            f"{ref.get('130', float('nan')):.2f}",
            f"{row['seconds_per_run']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def robust_table(results: list[dict]) -> str:
    """Default vs FGD per mix (given traces, then variants): means, their difference, and in
    how many seeds the default is at or above FGD."""
    by_key = {(r["trace"], r["policy"]): r for r in results}
    lines = [
        "| mix | seeds | default @100 | FGD @100 | Δ @100 | ≥ FGD | default @130 | FGD @130 "
        "| Δ @130 | ≥ FGD | default s/run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    mixes = sorted({r["trace"] for r in results}, key=lambda t: (t in VARIANTS, t))
    for mix in mixes:
        own, fgd = by_key.get((mix, "default")), by_key.get((mix, "fgd"))
        if not own or not fgd:
            continue
        cells = [mix.removeprefix("openb_pod_list_"), str(len(own["seeds"]))]
        for i, x in enumerate(("100", "130")):
            a, b = own["alloc_at"][x]["mean"], fgd["alloc_at"][x]["mean"]
            seeds = own["by_seed"].keys() & fgd["by_seed"].keys()
            wins = sum(own["by_seed"][s][i] >= fgd["by_seed"][s][i] for s in seeds)
            cells += [f"{a:.2f}", f"{b:.2f}", f"{a - b:+.2f}", f"{wins}/{len(seeds)}"]
        cells.append(f"{own['seconds_per_run']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
