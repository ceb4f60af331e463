"""Publish a corrected policy version for pools whose current one the scheduler misread.

Every pool's first version used to be {"fragmentation": 1.0, "binpack": 0.2, "locality": 0.1,
"warm_image": 0.1}, but the scorer is named "bin_pack" and the snapshot dropped names it did not
know, so those pools placed with a policy no benchmark measured. The snapshot now refuses
unknown names, and a version with no weights no longer falls back to the default. Versions are
immutable (decisions cite their number), so each affected pool gets a new version instead:

- the old default exactly -> the product default (placement.DEFAULT_POLICY, copied here
  as it is today so that this migration means the same thing forever);
- no weights -> the product default, which is what the snapshot used for them;
- any other use of "binpack" -> renamed "bin_pack", what its author meant.
"""

from django.db import migrations

LEGACY_DEFAULT = {"fragmentation": 1.0, "binpack": 0.2, "locality": 0.1, "warm_image": 0.1}
PRODUCT_DEFAULT = {
    "affinity": 1e9,
    "locality": 1e9,
    "failure_domain_spread": 1e9,
    "warm_image": 1e8,
    "paper_fgd": 1e6,
    "node_in_use": 1e3,
    "best_fit_unpinned": 1.0,
}


def corrected(weights):
    """The weights to publish instead of ``weights``, or None when they are fine."""
    if weights == LEGACY_DEFAULT or not weights or not isinstance(weights, dict):
        return dict(PRODUCT_DEFAULT)
    if "binpack" in weights:
        fixed = dict(weights)
        legacy = fixed.pop("binpack")
        fixed.setdefault("bin_pack", legacy)
        return fixed
    return None


def publish_corrected_versions(apps, schema_editor):
    SchedulingPolicy = apps.get_model("pools", "SchedulingPolicy")
    for policy in SchedulingPolicy.objects.all():
        current = policy.versions.order_by("-number").first()
        weights = corrected(current.weights) if current else None
        if weights is None:
            continue
        policy.versions.create(
            number=current.number + 1,
            weights=weights,
            knobs=current.knobs,
            comment=f"v{current.number} with scorer names the scheduler knows (issue 10)",
        )


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0002_priority_class_restrictions"),
    ]

    operations = [
        migrations.RunPython(publish_corrected_versions, migrations.RunPython.noop),
    ]
