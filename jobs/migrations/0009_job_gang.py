from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0008_job_idempotency_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="gang",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
