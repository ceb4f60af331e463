"""Pools still on the product's previous default policy get a version with today's default.

The default's fragmentation scorer is now `memory_fgd` (FGD's fragmentation coupled to the
memory a node has left: docs/scheduler.md), held at or above FGD on every trace and variant
measured (docs/benchmarks.md). Versions are immutable (decisions cite their number), so each
pool whose newest version IS the previous default, exactly, gets version n+1 with the new one;
a pool whose policy someone edited keeps it. Both defaults are copied here as they are today,
so that this migration means the same thing forever.
"""

from django.db import migrations

PREVIOUS_DEFAULT = {
    "affinity": 1e9,
    "locality": 1e9,
    "failure_domain_spread": 1e9,
    "warm_image": 1e8,
    "paper_fgd": 1e6,
    "node_in_use": 1e3,
    "best_fit_unpinned": 1.0,
}
NEW_DEFAULT = {
    "affinity": 1e9,
    "locality": 1e9,
    "failure_domain_spread": 1e9,
    "warm_image": 1e8,
    "memory_fgd": 1e6,
    "node_in_use": 1e3,
    "best_fit_unpinned": 1.0,
}


def publish_new_default(apps, schema_editor):
    SchedulingPolicy = apps.get_model("pools", "SchedulingPolicy")
    for policy in SchedulingPolicy.objects.all():
        current = policy.versions.order_by("-number").first()
        if current is None or current.weights != PREVIOUS_DEFAULT:
            continue
        policy.versions.create(
            number=current.number + 1,
            weights=dict(NEW_DEFAULT),
            knobs=current.knobs,
            comment=f"v{current.number} with the memory-coupled fragmentation default (issue 12)",
        )


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0007_quota_dimensions_credits"),
    ]

    operations = [
        migrations.RunPython(publish_new_default, migrations.RunPython.noop),
    ]
