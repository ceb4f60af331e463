"""Fair share's memory: each tenant's decayed past use of a pool (scheduling/fairshare.py)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0006_queue_policy"),
        ("scheduling", "0006_move_leases_to_their_app"),
    ]

    operations = [
        migrations.CreateModel(
            name="TenantUsage",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("cpu_millicore_s", models.FloatField(default=0.0)),
                ("memory_mib_s", models.FloatField(default=0.0)),
                ("gpu_s", models.FloatField(default=0.0)),
                ("updated_at", models.DateTimeField()),
                ("charge_error", models.CharField(blank=True, max_length=500)),
                (
                    "pool",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="pools.computepool",
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="pools.tenant",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tenant", "pool"), name="one_usage_per_tenant_pool"
                    )
                ],
            },
        ),
    ]
