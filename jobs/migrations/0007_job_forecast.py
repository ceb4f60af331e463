"""A queued job's queue class and predicted start window (scheduling/forecast.py)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0006_job_placement"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="forecast",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
