"""One trace per job (docs/observability.md "Traces"): a W3C trace id on every job and the
client's parent span id. Each existing job gets a random trace id of its own (a callable
default on AddField would give them all one)."""

import secrets

from django.db import migrations, models

import jobs.models


def fill_trace_ids(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"UPDATE {Job._meta.db_table} SET trace_id = "
            "md5(random()::text || clock_timestamp()::text || id::text) WHERE trace_id = ''"
        )
        return
    for pk in Job.objects.filter(trace_id="").values_list("pk", flat=True).iterator():
        Job.objects.filter(pk=pk).update(trace_id=secrets.token_hex(16))


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0013_job_reservation_anti_affinity_scope"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="parent_span_id",
            field=models.CharField(blank=True, default="", max_length=16),
        ),
        migrations.AddField(
            model_name="job",
            name="trace_id",
            field=models.CharField(default="", max_length=32),
            preserve_default=False,
        ),
        migrations.RunPython(fill_trace_ids, migrations.RunPython.noop, elidable=True),
        migrations.AlterField(
            model_name="job",
            name="trace_id",
            field=models.CharField(default=jobs.models.new_trace_id, max_length=32),
        ),
    ]
