"""Django settings, read from the environment (and from `.env` beside manage.py when present).

Without DATABASE_URL and REDIS_URL the project runs embedded: a PostgreSQL and a Redis that
`manage.py up` starts on Unix sockets inside the checkout (crm/embedded.py).
"""

from __future__ import annotations

import secrets
import urllib.parse
from datetime import timedelta
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

from crm import config, embedded, queues

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env")  # never overrides variables already in the environment

VAR_DIR = Path(env.str("CRM_VAR_DIR", default=str(BASE_DIR / "var")))


def _required(name: str) -> str:
    value = env.str(name, default="").strip()
    if not value:
        raise config.setting_error(name, "is required and not set (environment or .env)")
    return value


SECRET_KEY = _required("SECRET_KEY")
if len(SECRET_KEY) < 32:
    raise config.setting_error("SECRET_KEY", "is shorter than 32 characters")

ENCRYPTION_KEYS = config.parse_encryption_keys("ENCRYPTION_KEY", _required("ENCRYPTION_KEY"))
# Keys retired by a rotation: still decrypt, never encrypt (`manage.py rotate_secrets` re-encrypts).
ENCRYPTION_KEYS += (
    config.parse_encryption_keys("ENCRYPTION_OLD_KEYS", env.str("ENCRYPTION_OLD_KEYS"))
    if env.str("ENCRYPTION_OLD_KEYS", default="").strip()
    else []
)

DEBUG = config.parse_bool("DEBUG", env.str("DEBUG", default="false"))
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

EMBEDDED_DATABASE = "DATABASE_URL" not in env
EMBEDDED_REDIS = "REDIS_URL" not in env
EMBEDDED_POSTGRES, EMBEDDED_REDIS_SERVER = embedded.servers(VAR_DIR)
EMBEDDED_REDIS_SOCKET = EMBEDDED_REDIS_SERVER.socket

DATABASES: dict[str, dict[str, Any]]
if EMBEDDED_DATABASE:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": embedded.DATABASE_NAME,
            "USER": "postgres",
            "HOST": str(EMBEDDED_POSTGRES.socket_dir),
        }
    }
else:
    try:
        DATABASES = {"default": env.db("DATABASE_URL")}
    except (ImproperlyConfigured, ValueError, KeyError) as exc:
        raise config.setting_error("DATABASE_URL", f"cannot be parsed ({exc})") from None
    if DATABASES["default"].get("ENGINE") != "django.db.backends.postgresql":
        raise config.setting_error("DATABASE_URL", "must be postgres://user:password@host:5432/database")
    # libpq's URL form of a Unix socket: the directory, percent-encoded, as the host.
    DATABASES["default"]["HOST"] = urllib.parse.unquote(DATABASES["default"].get("HOST") or "")
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=60))
DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)

REDIS_URL = f"unix://{EMBEDDED_REDIS_SOCKET}" if EMBEDDED_REDIS else env.str("REDIS_URL")
_REDIS = config.parse_redis_url("REDIS_URL", REDIS_URL)

TIME_ZONE = config.validate_timezone("TIME_ZONE", env.str("TIME_ZONE", default="America/Sao_Paulo"))
USE_TZ = True
LANGUAGE_CODE = env.str("LANGUAGE_CODE", default="pt-br")
LANGUAGES = [("pt-br", "Português (Brasil)"), ("en", "English")]
if LANGUAGE_CODE not in dict(LANGUAGES):
    raise config.setting_error(
        "LANGUAGE_CODE", f"{LANGUAGE_CODE!r} is not one of {', '.join(dict(LANGUAGES))}"
    )
USE_I18N = True
# Numbers on pages in the locale's grouping ("1.234.567" in pt-BR). An id or a count that a URL, a
# form value, an HTML attribute or JavaScript reads is written with `|unlocalize` (or str() in Python):
# tests/crm/test_thousand_separator.py renders every admin page with ids past 1,000,000.
USE_THOUSAND_SEPARATOR = True
LOCALE_PATHS = [BASE_DIR / "locale"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "crm",  # before django_rq: its rq* commands (crm/management/commands) replace django-rq's
    "django_rq",
    "anymail",  # the ESPs' tracking webhooks (campaigns.esp_tracking) and its system checks
    "axes",  # failed admin logins throttled per account and per address
    "messaging",  # how anything is sent: below the apps that send
    "campaigns",
    "integrations",
    "erp",
    "surveys",
    "runner",
    "flows",  # event-triggered journeys: above the apps whose sends and events it uses
    "project",  # the composition root: urls, `demo`, `up`
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "crm.intake.NulParametersMiddleware",  # a NUL in a parameter: 400, before any query sees it
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "crm.intake.JsonErrorsMiddleware",  # webhooks: every error answered as JSON
    "crm.intake.DatabaseUnavailableMiddleware",  # webhooks: 503, never 500, when PostgreSQL is down
    "axes.middleware.AxesMiddleware",  # last: it answers a locked-out login
]

# The webhook intakes' (crm/wsgi.py): they use no session, user, CSRF, messages or language.
INTAKE_MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "crm.intake.JsonErrorsMiddleware",
    "crm.intake.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "crm.wsgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

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
            ],
        },
    },
]

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out account or address
    "django.contrib.auth.backends.ModelBackend",
]
# LOGIN_FAILURE_LIMIT failed logins lock the account, and separately the address, for
# LOGIN_LOCKOUT_MINUTES; a success clears the count. `manage.py axes_reset_username NAME` (or
# axes_reset_ip / axes_reset) unlocks at once.
AXES_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("LOGIN_LOCKOUT_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(VAR_DIR / "static")))

# Production behind a TLS-terminating proxy: trust its X-Forwarded-Proto, keep cookies to HTTPS,
# redirect plain HTTP (but not the probes a load balancer or Prometheus make inside the network)
# and send HSTS. `manage.py check --deploy` then has nothing to say.
BEHIND_TLS_PROXY = config.parse_bool("BEHIND_TLS_PROXY", env.str("BEHIND_TLS_PROXY", default="false"))
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if BEHIND_TLS_PROXY else None
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_SSL_REDIRECT = BEHIND_TLS_PROXY
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31_536_000 if BEHIND_TLS_PROXY else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = config.parse_bool(
    "SECURE_HSTS_INCLUDE_SUBDOMAINS", env.str("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=str(BEHIND_TLS_PROXY))
)
SECURE_HSTS_PRELOAD = config.parse_bool(
    "SECURE_HSTS_PRELOAD", env.str("SECURE_HSTS_PRELOAD", default=str(BEHIND_TLS_PROXY))
)
# The login throttle's client address: behind the proxy, the one it appended to X-Forwarded-For
# (else every failed login would count against the proxy's own address); else the peer itself.
AXES_IPWARE_META_PRECEDENCE_ORDER = (
    ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR") if BEHIND_TLS_PROXY else ("REMOTE_ADDR",)
)
AXES_IPWARE_PROXY_COUNT = 1 if BEHIND_TLS_PROXY else None

# --- Queues -------------------------------------------------------------------------------------
RQ_SERIALIZER = "rq.serializers.JSONSerializer"
RQ_QUEUES = {
    spec.name: {
        **_REDIS,
        "DEFAULT_TIMEOUT": spec.timeout,
        "DEFAULT_RESULT_TTL": spec.result_ttl,
        "SERIALIZER": RQ_SERIALIZER,
    }
    for spec in queues.QUEUES
}
# Enqueue only after the surrounding transaction commits, so a job never sees a row that is
# not there yet (and a rolled-back request enqueues nothing).
RQ = {
    "COMMIT_MODE": "on_db_commit",
    "WORKER_CLASS": "crm.worker.Worker",
    "QUEUE_CLASS": "crm.fairshare.FairQueue",  # tenants served in turn (docs/fair-share.md)
}
RQ_SHOW_ADMIN_LINK = False  # crm/admin.py registers django-rq's admin for platform operators only

# How fast a killed worker's job is noticed: the worker refreshes its job's heartbeat every
# CRM_HEARTBEAT_INTERVAL seconds; an entry not refreshed for CRM_HEARTBEAT_TTL seconds is
# abandoned, and every CRM_MAINTENANCE_INTERVAL seconds some live worker sweeps for those.
CRM_HEARTBEAT_INTERVAL = env.int("CRM_HEARTBEAT_INTERVAL", default=2)
CRM_HEARTBEAT_TTL = env.int("CRM_HEARTBEAT_TTL", default=10)
CRM_MAINTENANCE_INTERVAL = env.int("CRM_MAINTENANCE_INTERVAL", default=5)
CRM_WORKER_TTL = env.int("CRM_WORKER_TTL", default=20)
# An inbox drain batch shared by several organizations holds what the drain applies in this many
# seconds at its rate: under load it takes fewer events, so another organization's webhook accepted
# mid-batch waits about two of them (crm.inbox.shared_limit; 0: always crm.inbox.BATCH events).
INBOX_BATCH_SECONDS = env.float("INBOX_BATCH_SECONDS", default=0.2)
# Conversations an organization's Chatwoot push delivers side by side (each in order).
CHATWOOT_PUSH_CONCURRENCY = env.int("CHATWOOT_PUSH_CONCURRENCY", default=64)
# A JobRun still `running` with no live job after this long is re-dispatched by `recover`.
CRM_STALE_RUN_AFTER = env.int("CRM_STALE_RUN_AFTER", default=600)
# Benchmarks: workers add the SQL statements each job ran to the Redis counter crm:stats:db_queries.
CRM_COUNT_QUERIES = config.parse_bool("CRM_COUNT_QUERIES", env.str("CRM_COUNT_QUERIES", default="false"))
# GET /metrics (Prometheus) asks for "Authorization: Bearer <METRICS_TOKEN>"; empty = loopback only.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
# Outbound URLs organizations and operators configure (runner HTTP handlers, Chatwoot, ERP, Graph
# URL overrides, ESP API, pricing) may point at loopback/private/link-local addresses: on in the
# embedded mode (its sandboxes), off otherwise (integrations/outbound.py).
ALLOW_PRIVATE_OUTBOUND_URLS = config.parse_bool(
    "ALLOW_PRIVATE_OUTBOUND_URLS",
    env.str("ALLOW_PRIVATE_OUTBOUND_URLS", default="true" if EMBEDDED_DATABASE else "false"),
)

# --- WhatsApp (Meta Graph API) --------------------------------------------------------------
WHATSAPP_GRAPH_URL = env.str("WHATSAPP_GRAPH_URL", default="https://graph.facebook.com")
WHATSAPP_GRAPH_VERSION = env.str("WHATSAPP_GRAPH_VERSION", default="v23.0")
WHATSAPP_APP_SECRET = env.str("WHATSAPP_APP_SECRET", default="")
WHATSAPP_VERIFY_TOKEN = env.str("WHATSAPP_VERIFY_TOKEN", default="")
# A CSV rate card (country,category,price,currency) the weekly pricing job loads; empty = edit in the admin.
WHATSAPP_PRICING_URL = env.str("WHATSAPP_PRICING_URL", default="")
# Messages per send job (sent from customers' stores: split over the numbers in proportion to their
# pace, campaigns.fanout.batch_shares), and HTTP requests one worker process keeps in flight.
WHATSAPP_BATCH_SIZE = env.int("WHATSAPP_BATCH_SIZE", default=500)
WHATSAPP_MAX_IN_FLIGHT = env.int("WHATSAPP_MAX_IN_FLIGHT", default=500)
# A send job claims and sends its batch this many messages at a time; between two chunks it gives
# its turn to another tenant's work waiting on the queue (crm.jobs.yield_turn, docs/fair-share.md).
WHATSAPP_SEND_CHUNK = env.int("WHATSAPP_SEND_CHUNK", default=100)
# A paced number's chunk holds at least this many seconds of its rate (250 messages at 1,000/s).
WHATSAPP_SEND_CHUNK_SECONDS = env.float("WHATSAPP_SEND_CHUNK_SECONDS", default=0.25)
# While a chunk's sends are in flight (their answers outstanding), the job claims its next chunk
# (paced: books its slots right after them): neither the worker nor a number's schedule waits for a
# chunk's latency and writes. False: each chunk is claimed once the one before is written.
WHATSAPP_SEND_PIPELINE = env.bool("WHATSAPP_SEND_PIPELINE", default=True)
# A send job books each number's pacing slots this many seconds ahead at most; the rest of that
# number's messages wait for the job's next run, so a slow number never keeps a worker asleep.
WHATSAPP_PACE_WINDOW = env.float("WHATSAPP_PACE_WINDOW", default=10.0)
# A message claimed this long ago with no outcome is settled by the reconciliation job.
WHATSAPP_IN_FLIGHT_TIMEOUT = env.int("WHATSAPP_IN_FLIGHT_TIMEOUT", default=600)
# Flows send nothing in these local hours of the organization ("22:00-08:00"; empty: none): a send
# step due inside them waits for their end (docs/flows.md).
FLOWS_QUIET_HOURS = env.str("FLOWS_QUIET_HOURS", default="")

# --- Email ----------------------------------------------------------------------------------
# Absolute base of the public links in emails (tracking pixel, click redirects, one-click
# unsubscribe, survey pages): the address recipients reach this deployment at.
PUBLIC_URL = env.str("PUBLIC_URL", default="http://127.0.0.1:8000").rstrip("/")
if not PUBLIC_URL.startswith(("http://", "https://")):
    raise config.setting_error("PUBLIC_URL", "must start with http:// or https://")
# Messages per email-send job, and per claim (a killed worker leaves at most this many unknown).
EMAIL_BATCH_SIZE = env.int("EMAIL_BATCH_SIZE", default=200)
EMAIL_CLAIM_SIZE = env.int("EMAIL_CLAIM_SIZE", default=20)
# Messages one worker process hands over at once, each on its own SMTP connection (or ESP request).
EMAIL_CONNECTIONS = env.int("EMAIL_CONNECTIONS", default=4)
# An open SMTP connection idle longer than this is checked with NOOP before it is reused.
EMAIL_CONNECTION_IDLE_CHECK = env.int("EMAIL_CONNECTION_IDLE_CHECK", default=15)
# Seconds before the first retry of a soft bounce (doubling for the next): the seed's 60 s.
EMAIL_RETRY_BACKOFF = env.float("EMAIL_RETRY_BACKOFF", default=60.0)
# "user:password" the ESPs' tracking webhooks (/anymail/<esp>/tracking/) must send as HTTP basic auth;
# give the ESP https://user:password@<host>/anymail/postmark/tracking/ (or sendgrid, mailgun, brevo).
# Unset, anymail would accept webhooks from anyone, so a random secret nobody knows is used instead
# and every webhook is refused (400).
ANYMAIL_WEBHOOK_SECRET = env.str("ANYMAIL_WEBHOOK_SECRET", default="")
if ANYMAIL_WEBHOOK_SECRET and ":" not in ANYMAIL_WEBHOOK_SECRET:
    raise config.setting_error("ANYMAIL_WEBHOOK_SECRET", 'must be "user:password"')
ANYMAIL = {"WEBHOOK_SECRET": ANYMAIL_WEBHOOK_SECRET or f"refused:{secrets.token_urlsafe(32)}"}

# --- Sales -------------------------------------------------------------------------------------
# A sale stamped more than this many seconds ahead of now (a wrong ERP clock) is refused by the
# sync, counted, and never attributed to a campaign.
SALE_FUTURE_TOLERANCE_SECONDS = env.int("SALE_FUTURE_TOLERANCE_SECONDS", default=300)
if SALE_FUTURE_TOLERANCE_SECONDS < 0:
    raise config.setting_error("SALE_FUTURE_TOLERANCE_SECONDS", "must be 0 or more")

# --- Segments -----------------------------------------------------------------------------------
# Daily RFM segment snapshots kept per organization (the newest and the days before it); older
# ones are deleted by the daily job.
SEGMENT_KEEP_DAYS = env.int("SEGMENT_KEEP_DAYS", default=35)
if SEGMENT_KEEP_DAYS < 1:
    raise config.setting_error("SEGMENT_KEEP_DAYS", "must be 1 or more")

# --- Integration runner -------------------------------------------------------------------------
# The RabbitMQ broker `runner_consume` reads (the queue trigger).
AMQP_URL = env.str("AMQP_URL", default="amqp://guest:guest@127.0.0.1:5672/%2F")

# --- Logging ------------------------------------------------------------------------------------
LOG_LEVEL = env.str("LOG_LEVEL", default="INFO").upper()
LOG_FORMAT = env.str("LOG_FORMAT", default="text")
if LOG_FORMAT not in ("text", "json"):
    raise config.setting_error("LOG_FORMAT", "must be text or json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "crm.logfmt.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "rq.worker": {"level": "WARNING"},
        "rq.scheduler": {"level": "WARNING"},
        "rq_scheduler.scheduler": {"level": "WARNING"},
        # One INFO line per HTTP request (with its query string): noise in commands and workers.
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
        "mail.log": {"level": "WARNING"},  # aiosmtpd (the SMTP sandbox): a line per connection
    },
}
