"""Lease and LeaseEvent now live in the leases app (leases 0001): removed from scheduling's
state only; their tables, rows and constraints are kept and used by leases."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0005_lease_idempotency_digest"),
        ("leases", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="LeaseEvent"),
                migrations.DeleteModel(name="Lease"),
            ],
        ),
    ]
