"""Settings of the server `bench_leases` starts: the project settings, quiet and not DEBUG.

Under ASGI each request runs in its own thread, so Django's persistent connections do not
carry over between requests; when psycopg_pool is installed, the server uses a connection pool.
"""

import importlib.util
import os

os.environ.setdefault("DEBUG", "false")

from config.settings import *  # noqa: F403
from config.settings import DATABASES

DEBUG = False
LOGGING = {
    "version": 1,
    "disable_existing_loggers": True,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
if importlib.util.find_spec("psycopg_pool") is not None:
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": int(os.environ.get("BENCH_DB_POOL_MIN", "4")),
        "max_size": int(os.environ.get("BENCH_DB_POOL_MAX", "32")),
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
