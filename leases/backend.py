"""The one database-capability switch of the ledger's hot paths.

`postgresql()` decides, for the snapshot (`leases/snapshot_rows.py`), the ledger's writes
(`leases/services/capacity.py`, `lease_rows.py`), group commit, the scheduling pass and the
forecast's write (`scheduling/forecast.py`) together: PostgreSQL statements (JSON
aggregation, json_to_recordset, COPY, a batch pass), or the portable ORM paths with the same
guards that SQLite takes (`make run` with nothing configured: one job at a time, no group
commit). Setting `LEASE_PORTABLE_PATHS` sends
PostgreSQL down the portable paths too, all of them at once, so a test of what a SQLite
deployment runs runs exactly that.
"""

from django.conf import settings
from django.db import connection


def postgresql() -> bool:
    return connection.vendor == "postgresql" and not settings.LEASE_PORTABLE_PATHS
