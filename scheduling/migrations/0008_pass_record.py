"""Scheduler health: a record per pass and per-pool capacity samples (scheduling/health.py)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0006_queue_policy"),
        ("scheduling", "0007_tenant_usage"),
    ]

    operations = [
        migrations.CreateModel(
            name="CapacitySample",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("at", models.DateTimeField()),
                ("totals", models.JSONField(blank=True, default=dict)),
                ("error", models.CharField(blank=True, max_length=500)),
                (
                    "pool",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="pools.computepool",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["pool", "at"], name="scheduling__pool_id_fe1754_idx")
                ],
            },
        ),
        migrations.CreateModel(
            name="PassRecord",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("started_at", models.DateTimeField()),
                ("duration_s", models.FloatField()),
                ("considered", models.PositiveIntegerField(default=0)),
                ("placed", models.PositiveIntegerField(default=0)),
                ("conflicts", models.PositiveIntegerField(default=0)),
                ("errors", models.PositiveIntegerField(default=0)),
                (
                    "pool",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="pools.computepool",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        fields=["pool", "started_at"], name="scheduling__pool_id_f121c2_idx"
                    )
                ],
            },
        ),
    ]
