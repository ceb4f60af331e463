"""Lease and LeaseEvent move here from scheduling/ without touching the database: the tables
(scheduling_lease, scheduling_leaseevent), their rows, indexes and constraints stay as they are;
only Django's state moves (scheduling 0006 drops them from scheduling's state). The content
types are renamed so that permissions and admin history follow the models."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

import leases.models

MOVED = ("lease", "leaseevent")


def rename_content_types(old: str, new: str):
    def rename(apps, schema_editor):
        content_type = apps.get_model("contenttypes", "ContentType")
        taken = set(
            content_type.objects.filter(app_label=new, model__in=MOVED).values_list(
                "model", flat=True
            )
        )
        content_type.objects.filter(app_label=old, model__in=set(MOVED) - taken).update(
            app_label=new
        )

    return rename


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("scheduling", "0005_lease_idempotency_digest"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Lease",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "state",
                            models.CharField(
                                choices=[
                                    ("reserved", "Reserved"),
                                    ("committed", "Committed"),
                                    ("released", "Released"),
                                    ("expired", "Expired"),
                                    ("uncertain", "Uncertain"),
                                ],
                                db_index=True,
                                default="reserved",
                                max_length=10,
                            ),
                        ),
                        (
                            "state_changed_at",
                            models.DateTimeField(default=django.utils.timezone.now),
                        ),
                        ("cpu_millicores", models.PositiveIntegerField()),
                        ("memory_mib", models.PositiveIntegerField()),
                        ("scratch_mib", models.PositiveIntegerField(default=0)),
                        (
                            "gpu_allocations",
                            models.JSONField(
                                blank=True,
                                default=list,
                                help_text='[{"gpu": id, "index": i, "milli": m, "mig_slots": mask}]',
                            ),
                        ),
                        (
                            "request",
                            models.JSONField(
                                default=dict, help_text="The resource request as asked"
                            ),
                        ),
                        (
                            "placement",
                            models.JSONField(
                                default=dict, help_text="Granted values and score breakdown"
                            ),
                        ),
                        ("policy_version", models.PositiveIntegerField(blank=True, null=True)),
                        (
                            "fencing_token",
                            models.BigIntegerField(default=leases.models.new_fencing_token),
                        ),
                        ("expires_at", models.DateTimeField(db_index=True)),
                        ("committed_at", models.DateTimeField(blank=True, null=True)),
                        ("ended_at", models.DateTimeField(blank=True, null=True)),
                        ("idempotency_key", models.CharField(blank=True, max_length=100)),
                        (
                            "idempotency_digest",
                            models.CharField(blank=True, default="", max_length=64),
                        ),
                        ("window_start", models.DateTimeField(blank=True, null=True)),
                        ("window_end", models.DateTimeField(blank=True, null=True)),
                        ("tolerance_s", models.PositiveIntegerField(default=0)),
                        ("uncertain_since", models.DateTimeField(blank=True, null=True)),
                        ("used_cpu_millicores", models.PositiveIntegerField(blank=True, null=True)),
                        ("used_memory_mib", models.PositiveIntegerField(blank=True, null=True)),
                        ("used_gpu_milli", models.PositiveIntegerField(blank=True, null=True)),
                        ("usage_reported_at", models.DateTimeField(blank=True, null=True)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        (
                            "backfill_of",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="backfills",
                                to="leases.lease",
                            ),
                        ),
                        (
                            "created_by",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "job",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="leases",
                                to="jobs.job",
                            ),
                        ),
                        (
                            "node",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="leases",
                                to="nodes.node",
                            ),
                        ),
                        (
                            "pool",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="leases",
                                to="pools.computepool",
                            ),
                        ),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="leases",
                                to="pools.tenant",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "scheduling_lease",
                        "ordering": ["-created_at", "-id"],
                    },
                ),
                migrations.CreateModel(
                    name="LeaseEvent",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        ("actor_kind", models.CharField(max_length=8)),
                        ("actor_label", models.CharField(max_length=200)),
                        ("from_state", models.CharField(blank=True, max_length=20)),
                        ("to_state", models.CharField(max_length=20)),
                        ("reason", models.CharField(db_index=True, max_length=40)),
                        ("message", models.TextField(blank=True)),
                        ("data", models.JSONField(blank=True, default=dict)),
                        (
                            "actor_user",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "lease",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="events",
                                to="leases.lease",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "scheduling_leaseevent",
                        "ordering": ["at", "id"],
                        "abstract": False,
                    },
                ),
                migrations.AddIndex(
                    model_name="lease",
                    index=models.Index(
                        fields=["state", "expires_at"], name="scheduling__state_ee4c00_idx"
                    ),
                ),
                migrations.AddIndex(
                    model_name="lease",
                    index=models.Index(
                        fields=["pool", "state"], name="scheduling__pool_id_fcd00f_idx"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="lease",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(("idempotency_key", ""), _negated=True),
                        fields=("tenant", "idempotency_key"),
                        name="lease_idempotency_key_unique_per_tenant",
                    ),
                ),
            ],
        ),
        migrations.RunPython(
            rename_content_types("scheduling", "leases"),
            rename_content_types("leases", "scheduling"),
        ),
    ]
