"""One settings module, driven by environment variables (django-environ).

Nothing configured gives a working development setup: SQLite in ./var, Redis on localhost
(`make run` starts an embedded Redis-protocol server when none answers).
"""

import hashlib
from datetime import timedelta
from pathlib import Path

import environ

from config.logging import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, False),
    SECRET_KEY=(str, "dev-insecure-change-me"),
    ALLOWED_HOSTS=(list, ["127.0.0.1", "localhost", "[::1]", "testserver"]),
    DATABASE_URL=(str, f"sqlite:///{BASE_DIR / 'var' / 'db.sqlite3'}"),
    REDIS_URL=(str, "redis://127.0.0.1:6379/0"),
    CELERY_BROKER_URL=(str, ""),
    CELERY_RESULT_BACKEND=(str, ""),
    CELERY_TASK_ALWAYS_EAGER=(bool, False),
    API_TOKEN_DEFAULT_TTL_DAYS=(int, 90),
    LEASE_DEFAULT_TTL_SECONDS=(int, 300),
    LEASE_GROUP_COMMIT=(bool, True),
    DATABASE_POOL_MAX_SIZE=(int, 0),
    API_TOKEN_AUTH_CACHE_SECONDS=(float, 5.0),
    REGISTRY_INSECURE_HOSTS=(list, []),
    OBJECT_STORE_ENDPOINTS=(list, []),
    REGISTRY_TIMEOUT_SECONDS=(float, 5.0),
    MEDIA_ROOT=(str, str(BASE_DIR / "var" / "media")),
    PLACEMENT_THROTTLE_RATE=(str, "600/minute"),
    TENANT_MAX_QUEUED_JOBS=(int, 1000),
    JOB_OUTPUT_MAX_BYTES=(int, 1024**3),
    HTTP_HEADER_TIMEOUT_S=(float, 10.0),
    HTTP_BODY_TIMEOUT_S=(float, 10.0),
    DEPLOYMENT_PREFIX=(str, ""),
    CHANNEL_LAYER_PREFIX=(str, ""),  # DEPLOYMENT_PREFIX's former name, still read
)
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env("DEBUG")
SECRET_KEY = env("SECRET_KEY")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "daphne",
    "config.apps.PolicyAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "channels",
    "config.apps.ProjectConfig",
    "pools",
    "nodes",
    "storage",
    "leases",
    "jobs",
    "scheduling",
    "observability",
]

MIDDLEWARE = [
    "config.request_id.RequestIdMiddleware",  # first: every line below has the request id
    # a request's time includes every other middleware's (observability/process.py)
    "observability.process.RequestMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "config.middleware.RejectNulMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "config.middleware.CommonMiddleware",  # Django's, without redirects under /api/
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "config.middleware.ConsoleMessageMiddleware",  # Django's, not under /api/
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

# Request bodies above 1 MiB are refused (a JSON 413 on the API, pools/api/errors.py): the
# largest legitimate one, a node's inventory, is a few KiB.
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
# Slow clients (docs/security.md "Slow clients"): a request's line and headers must all arrive
# within HTTP_HEADER_TIMEOUT_S of the connection opening or of the previous response, which is
# also how long an idle keep-alive connection stays open (config/hypercorn.py); each chunk of a
# body within HTTP_BODY_TIMEOUT_S of the one before (config/timeouts.py), else a 408.
HTTP_HEADER_TIMEOUT_S = env("HTTP_HEADER_TIMEOUT_S")
HTTP_BODY_TIMEOUT_S = env("HTTP_BODY_TIMEOUT_S")

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "config.console.console",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # SQLite serialises writers, and under `make run` the web process and the worker's two
    # processes write at once (beat's tasks beside the pass).
    # `timeout`: a writer waits up to 20 s for the lock instead of failing at once. IMMEDIATE:
    # every transaction takes the write lock at BEGIN, so one that reads and then writes (a
    # capacity sample, a sweep) waits in the busy timeout; a deferred one that has read is
    # refused at once ("database is locked", the busy timeout cannot help it) when another
    # connection writes or has written since its read. WAL: readers
    # and the one writer do not block each other; synchronous=NORMAL is WAL's safe setting (a
    # power cut may lose the last commits, never corrupt the file).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
        }
    )
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env(
    "DATABASE_POOL_MAX_SIZE"
):
    # psycopg's connection pool (Django's native support): no connect per request.
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 2,
        "max_size": env("DATABASE_POOL_MAX_SIZE"),
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "var" / "staticfiles"
# Job outputs (Django's default storage: local files). Never served as static media: only the
# API hands them out, through the job's visibility (GET /api/v1/jobs/{id}/outputs/{name}).
MEDIA_ROOT = env("MEDIA_ROOT")
MEDIA_URL = "media/"
# One output file of a job; larger uploads are refused (and their partial file deleted).
JOB_OUTPUT_MAX_BYTES = env("JOB_OUTPUT_MAX_BYTES")
# The control plane's own object store (docs/storage.md, "Object stores"): with
# OUTPUTS_TO_OBJECT_STORE on, Django's default storage — where outputs of output_destination ""
# go — is django-storages' S3 backend on this bucket, instead of files under MEDIA_ROOT. Any
# S3-compatible store (MinIO, Ceph RGW, AWS S3), path-style, SigV4; server-side encryption
# requested with OBJECT_STORE_SERVER_SIDE_ENCRYPTION ("" for none).
OBJECT_STORE_ENDPOINT_URL = env.str("OBJECT_STORE_ENDPOINT_URL", default="")
OBJECT_STORE_REGION = env.str("OBJECT_STORE_REGION", default="us-east-1")
OBJECT_STORE_ACCESS_KEY_ID = env.str("OBJECT_STORE_ACCESS_KEY_ID", default="")
OBJECT_STORE_SECRET_ACCESS_KEY = env.str("OBJECT_STORE_SECRET_ACCESS_KEY", default="")
OBJECT_STORE_BUCKET = env.str("OBJECT_STORE_BUCKET", default="")
OBJECT_STORE_SERVER_SIDE_ENCRYPTION = env.str(
    "OBJECT_STORE_SERVER_SIDE_ENCRYPTION", default="AES256"
)
OUTPUTS_TO_OBJECT_STORE = env.bool("OUTPUTS_TO_OBJECT_STORE", default=False)
# the image of a volume's export job (jobs/volume_export.py): any image with `sh` and `tar`
VOLUME_EXPORT_IMAGE = env.str("VOLUME_EXPORT_IMAGE", default="docker.io/library/busybox:1.36")


def object_store_storage() -> dict:
    """STORAGES["default"] on the control plane's own bucket (django-storages' S3 backend)."""
    return {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "endpoint_url": OBJECT_STORE_ENDPOINT_URL or None,
            "region_name": OBJECT_STORE_REGION,
            "access_key": OBJECT_STORE_ACCESS_KEY_ID,
            "secret_key": OBJECT_STORE_SECRET_ACCESS_KEY,
            "bucket_name": OBJECT_STORE_BUCKET,
            "addressing_style": "path",
            "signature_version": "s3v4",
            "default_acl": None,
            "file_overwrite": False,
            "querystring_auth": True,
            "object_parameters": (
                {"ServerSideEncryption": OBJECT_STORE_SERVER_SIDE_ENCRYPTION}
                if OBJECT_STORE_SERVER_SIDE_ENCRYPTION
                else {}
            ),
        },
    }


if OUTPUTS_TO_OBJECT_STORE:
    STORAGES = {
        "default": object_store_storage(),
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"

REDIS_URL = env("REDIS_URL")


def _deployment_prefix(database: dict) -> str:
    """One prefix per database by default: every process of one deployment shares it, and two
    deployments on one Redis (two `make run`s, staging beside production) never do."""
    where = "|".join(str(database.get(key) or "") for key in ("ENGINE", "HOST", "PORT", "NAME"))
    return "cp-" + hashlib.sha256(where.encode()).hexdigest()[:12]


# Every Redis key of one deployment carries this prefix: Celery's queues, the channel layer, the
# throttles' and sign-in counts, the nonces, beat's lock and heartbeat. Two deployments on one
# Redis database (two `make run`s, staging beside production) then never take each other's
# tasks or events. Every process of a deployment must agree on it (docs/deployment.md).
DEPLOYMENT_PREFIX = (
    env("DEPLOYMENT_PREFIX")
    or env("CHANNEL_LAYER_PREFIX")
    or _deployment_prefix(DATABASES["default"])
)


CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    # Failed sign-ins (config/throttle.py) live in Redis so that every server process counts
    # them together; short timeouts so that a dead Redis costs a sign-in at most a second.
    "throttle": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": f"computepool:throttle:{DEPLOYMENT_PREFIX}",
        "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    },
    # The nonces of nodes' signed requests (nodes/signatures.py), shared by every web process so
    # that a replay to another one is caught too.
    "nonces": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": f"computepool:nonce:{DEPLOYMENT_PREFIX}",
        "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    },
}

# A consumer waits for its next event with BZPOPMIN, which Redis answers after 5 s when nothing
# came (channels_redis's `brpop_timeout`). redis-py 8 gives every read a 5 s socket_timeout by
# default, so the idle wait raced it and lost: TimeoutError, and the socket closed (1011). The
# read timeout is longer than the blocking pop, and still bounds a Redis that stopped answering.
CHANNEL_LAYER_SOCKET_TIMEOUT_S = 15


CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT_S}],
            "prefix": DEPLOYMENT_PREFIX,
        },
    }
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "nodes.authentication.NodeCredentialAuthentication",
        "pools.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    # JSON and forms, refusing NUL and deep nesting (pools/api/parsers.py)
    "DEFAULT_PARSER_CLASSES": [
        "pools.api.parsers.JSONParser",
        "pools.api.parsers.FormParser",
        "pools.api.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "pools.api.pagination.LimitOffsetPagination",  # limit ≤ 1000
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "pools.api.errors.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Compute Pool API",
    "DESCRIPTION": "Declarative resource shapes in; leases, placements and events out.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "ENUM_NAME_OVERRIDES": {
        "ArchitectureEnum": "pools.choices.Architecture",
        "NodeStateEnum": "nodes.choices.NodeState",  # a node and the agent's own node
        "ContainerRuntimeEnum": "pools.choices.ContainerRuntime",
    },
    # the docs page's assets from our own static files (drf-spectacular-sidecar), not a CDN
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

CELERY_BROKER_URL = env("CELERY_BROKER_URL") or REDIS_URL
if CELERY_BROKER_URL.startswith(("redis://", "rediss://", "unix://")):  # kombu's Redis transport
    CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": f"{DEPLOYMENT_PREFIX}:"}
CELERY_RESULT_BACKEND = env("CELERY_RESULT_BACKEND") or None
CELERY_TASK_ALWAYS_EAGER = env("CELERY_TASK_ALWAYS_EAGER")
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"

API_TOKEN_DEFAULT_TTL = timedelta(days=env("API_TOKEN_DEFAULT_TTL_DAYS"))
LEASE_DEFAULT_TTL = timedelta(seconds=env("LEASE_DEFAULT_TTL_SECONDS"))
# Concurrent reserves in one server process share a snapshot and one transaction (PostgreSQL).
LEASE_GROUP_COMMIT = env("LEASE_GROUP_COMMIT")
# The ledger's one database-capability switch (leases/backend.py): True sends PostgreSQL down the
# portable ORM paths SQLite takes (snapshot, ledger writes, the single-path scheduling pass, no
# group commit); the tests of what a SQLite deployment (`make run`) runs set it.
LEASE_PORTABLE_PATHS = False
# A token revoked in another process is refused within this many seconds (0: no cache).
API_TOKEN_AUTH_CACHE_SECONDS = env("API_TOKEN_AUTH_CACHE_SECONDS")
# Image registries (pools/registry.py): these host[:port]s are reached over plain http, every
# other one over https (none by default); each request gives up after the timeout. `make run`
# (runstack), the test settings and fuzz_api name the loopback test registry that
# .ci/ensure-services.sh runs, LOOPBACK_REGISTRY_HOSTS.
LOOPBACK_REGISTRY_HOSTS = ["127.0.0.1:5000", "localhost:5000"]
REGISTRY_INSECURE_HOSTS = env("REGISTRY_INSECURE_HOSTS")
# Object stores whose objects the control plane presigns as a job's inputs ("http://127.0.0.1:
# 9000"): only those inputs are exempt from the loopback rule on the agent (jobs/networks.py).
OBJECT_STORE_ENDPOINTS = env("OBJECT_STORE_ENDPOINTS")
REGISTRY_TIMEOUT_SECONDS = env("REGISTRY_TIMEOUT_SECONDS")
# No tenant fills the control plane (docs/security.md, Throttles): placement searches per tenant
# (POST /compute-leases and /jobs, pools/api/throttles.py; "" turns it off), and queued jobs of a
# tenant in a pool where it has no Quota row (Quota.max_queued_jobs otherwise).
PLACEMENT_THROTTLE_RATE = env("PLACEMENT_THROTTLE_RATE")
TENANT_MAX_QUEUED_JOBS = env("TENANT_MAX_QUEUED_JOBS")
# The scheduling pass (scheduling/passes.py) plans at most this many queued jobs per pass, on
# one snapshot per pool, and applies them in one transaction per pool: 2,000 plan and apply in
# well under the 2 s period on 5,000 nodes (docs/benchmarks.md, bench_scheduler).
SCHEDULER_PASS_MAX_JOBS = env.int("SCHEDULER_PASS_MAX_JOBS", default=2000)
# How often beat starts a pass (config/celery.py); the pass task's expiry and time limit follow
# from it (scheduling/tasks.py).
SCHEDULER_PASS_PERIOD_S = env.float("SCHEDULER_PASS_PERIOD_S", default=2.0)
# Placement on events (scheduling/coalesce.py): a job submitted, a lease's capacity returned or
# a node become ready (or back from silence) asks for a pass of its pool once committed, through
# the Celery task scheduling.pool_pass; a pool's passes so started begin at least this many
# seconds after its previous pass ended, so a burst of submits makes a few passes, not hundreds.
# Off: only beat's pass places (the test settings turn it off; their tasks run inline).
SCHEDULER_EVENT_PASSES = env.bool("SCHEDULER_EVENT_PASSES", default=True)
SCHEDULER_EVENT_MIN_INTERVAL_S = env.float("SCHEDULER_EVENT_MIN_INTERVAL_S", default=0.25)
# Scheduler health (scheduling/health.py): pass records and capacity samples are kept this many
# hours for the operators' charts, then pruned.
SCHEDULER_HEALTH_WINDOW_HOURS = env.int("SCHEDULER_HEALTH_WINDOW_HOURS", default=24)
# Metrics (docs/observability.md): GET /metrics answers tokens with the metrics:read scope,
# operators, and clients whose address is in METRICS_ALLOWED_CIDRS (a scraper on the host or
# the cluster network). Behind a load balancer, list its addresses in TRUSTED_PROXY_CIDRS: a
# request from one of them is from the last address of X-Forwarded-For that is not a proxy.
METRICS_ALLOWED_CIDRS = env.list("METRICS_ALLOWED_CIDRS", default=[])
TRUSTED_PROXY_CIDRS = env.list("TRUSTED_PROXY_CIDRS", default=[])
# The first this many tenants (the oldest) label their own series; the rest are `other`.
METRICS_TENANT_LABELS = env.int("METRICS_TENANT_LABELS", default=50)
# How often the event log is folded into counters and histograms (observability/fold.py).
METRICS_FOLD_PERIOD_S = env.float("METRICS_FOLD_PERIOD_S", default=5.0)
# Lease creation per tenant, and lease creation, job submit and explain per token (a session:
# per person), shared by every server process through Redis in batches of permits
# (pools/api/throttles.py SharedPermits; docs/security.md, Throttles); "" turns one off.
LEASE_THROTTLE_RATE = env.str("LEASE_THROTTLE_RATE", default="6000/minute")
TOKEN_THROTTLE_RATE = env.str("TOKEN_THROTTLE_RATE", default="6000/minute")

# The key ring of values encrypted at rest (tenants' secrets; pools/encryption.py): key id →
# 32-byte key in URL-safe base64, the first entry current (`ENCRYPTION_KEYS=new=<key>,old=<key>`).
# Without the variable the file ENCRYPTION_KEYS_FILE holds the ring in the same form (`make run`
# writes one there once, mode 0600: `manage.py encryption_key --init-file`).
ENCRYPTION_KEYS_FILE = Path(
    env.str("ENCRYPTION_KEYS_FILE", default=str(BASE_DIR / "var" / "encryption-keys"))
)
ENCRYPTION_KEYS = env.dict("ENCRYPTION_KEYS", default={})
if not ENCRYPTION_KEYS and ENCRYPTION_KEYS_FILE.is_file():
    ENCRYPTION_KEYS = env.parse_value(ENCRYPTION_KEYS_FILE.read_text().strip(), dict)

# Log lines (config/logging.py, docs/observability.md "Logs"): every one through one formatter,
# JSON lines (`json`) or lines for people (`console`); default: console with DEBUG (`make run`),
# JSON otherwise.
LOG_FORMAT = env.str("LOG_FORMAT", default="") or ("console" if DEBUG else "json")
LOGGING = logging_config(LOG_FORMAT)
