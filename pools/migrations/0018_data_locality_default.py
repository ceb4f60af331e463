"""Pools still on the product's previous default policy get a version with today's default.

The default now weighs `data_locality` (issue 23: nodes that already hold a job's image or
inputs, and the seconds the rest takes to arrive; docs/storage.md "Data locality"). As in
0008, a pool whose newest version IS the previous default, exactly, gets version n+1 with the
new one; a pool whose policy someone edited keeps it (its policy admin adds the weight when
they choose). Both defaults are copied here as they are today, so that this migration means
the same thing forever.
"""

from django.db import migrations

PREVIOUS_DEFAULT = {
    "affinity": 1e9,
    "locality": 1e9,
    "failure_domain_spread": 1e9,
    "warm_image": 1e8,
    "memory_fgd": 1e6,
    "node_in_use": 1e3,
    "best_fit_unpinned": 1.0,
}
NEW_DEFAULT = PREVIOUS_DEFAULT | {"data_locality": 1e8}


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
            comment=f"v{current.number} with the data-locality default (issue 23)",
        )


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0017_tenant_buckets"),
    ]

    operations = [
        migrations.RunPython(publish_new_default, migrations.RunPython.noop),
    ]
