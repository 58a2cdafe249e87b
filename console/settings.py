"""Django settings for Recovery Console (docs/configuration.md, docs/deploy.md).
Everything that differs between a laptop and production comes from the environment through console/env.py.
"""

from pathlib import Path

from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from console.env import (
    database_from_env,
    env_bool,
    env_host_port,
    env_int,
    env_keyring,
    env_list,
    env_seconds_by_key,
    env_str,
    redis_url_from_env,
)
from recovery.engine.due import DUE_QUEUES  # pure Python: the queues a due time may be given for

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("RECOVERY_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)

if DEBUG:
    SECRET_KEY = env_str("SECRET_KEY", "dev-only-insecure-key-" + "x" * 40)
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
else:
    SECRET_KEY = env_str("SECRET_KEY")
    if len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5:
        raise ImproperlyConfigured("SECRET_KEY must be at least 50 characters with at least 5 distinct ones")
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [])
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured("ALLOWED_HOSTS must be set when DEBUG is off (comma-separated host names)")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",  # runserver serves static files the way production does: through WhiteNoise
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "csp",
    "django_rq",
    "ninja",
    "recovery",
    "recovery.devtools",  # the sandbox, drills, benchmarks and demo: commands only, no models
    "console",
]

MIDDLEWARE = [
    # Before anything reads the host or redirects to HTTPS: load balancers probe /healthz and /readyz by IP.
    "console.health.HealthMiddleware",
    # First, so that every answer under /api/ — the other middleware's included — is the API's JSON envelope.
    "console.middleware.ApiEdgeMiddleware",
    # DEBUG's technical 404 and 500 pages replaced by the console's own unless RECOVERY_TECHNICAL_ERRORS is set.
    "console.middleware.ConsoleErrorPagesMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # The pages' own middleware, each skipped for the API's calls (console/middleware.py, _pages_only): sessions,
    # signed-in users, messages, CSP and htmx are the pages' business, not a bearer token's. CSRF stays whole (the
    # API's views are exempt from it, and the deployment checks look for it by name).
    "console.middleware.PagesOnlySessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "console.middleware.PagesOnlyAuthenticationMiddleware",
    "console.middleware.PagesOnlyMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "console.middleware.PagesOnlyCSPMiddleware",
    "console.middleware.PagesOnlyHtmxMiddleware",
    "console.middleware.HtmxSignInRedirectMiddleware",
]

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"

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

DATABASES = {"default": database_from_env("DATABASE_URL", sqlite_default=VAR_DIR / "recovery.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Absent REDIS_URL means background jobs run on the in-process scheduler (the embedded default).
REDIS_URL = redis_url_from_env("REDIS_URL")
# How long a web process keeps what /readyz found (console/health.py): a probe every second costs one statement per
# this many seconds.
RECOVERY_READY_CACHE_S = env_int("RECOVERY_READY_CACHE_S", 2, minimum=0)
RQ_QUEUES = {"default": {"URL": REDIS_URL or "redis://127.0.0.1:6379/0", "DEFAULT_TIMEOUT": 300}}
# How often the periodic jobs (recovery/jobs/cron.py) run: check the calls whose status check is due, sweep SENT
# calls past their outcome timeout, and flag open tasks past their deadline without a submission.
RECOVERY_RECONCILE_EVERY_S = env_int("RECOVERY_RECONCILE_EVERY_S", 2, minimum=1)
RECOVERY_SWEEP_EVERY_S = env_int("RECOVERY_SWEEP_EVERY_S", 5, minimum=1)
RECOVERY_NO_SUBMISSION_EVERY_S = env_int("RECOVERY_NO_SUBMISSION_EVERY_S", 5, minimum=1)
# Metrics (docs/metrics.md): how often the fold adds new audit events to the rollups that pages and /metrics read (the
# figures are at most this old), and the most a run folds before it leaves the rest to the next one.
RECOVERY_METRICS_FOLD_EVERY_S = env_int("RECOVERY_METRICS_FOLD_EVERY_S", 10, minimum=1)
# Retention (docs/deploy.md): the receipts, gate answers and response bodies of calls settled this many days ago, in
# tasks that are closed, are removed by a periodic job (0: kept forever). The calls, their attempts, decision cards,
# the audit trail and the metrics' rollups are never removed.
RECOVERY_RETENTION_DAYS = env_int("RECOVERY_RETENTION_DAYS", 0, minimum=0)
RECOVERY_RETENTION_EVERY_S = env_int("RECOVERY_RETENTION_EVERY_S", 3600, minimum=60)
RECOVERY_METRICS_FOLD_MAX_S = env_int("RECOVERY_METRICS_FOLD_MAX_S", 30, minimum=1)
# Reconciliation: status queries in flight per worker, and how long a worker's claim on a call lasts.
RECOVERY_CHECKS_IN_FLIGHT = env_int("RECOVERY_CHECKS_IN_FLIGHT", 8, minimum=1)
RECOVERY_CHECK_LEASE_S = env_int("RECOVERY_CHECK_LEASE_S", 60, minimum=5)
# Operator actions (docs/actions.md): a preview or a request not decided within RECOVERY_ACTION_TTL_S expires; read-only
# actions (reconcile now) may run on the requester's confirmation alone, writes always need a second person; a worker
# executing an approved action holds it RECOVERY_ACTION_LEASE_S (at least its provider's timeouts), after which a dead
# worker's request is marked interrupted, never run again. The periodic expiry and sweep run every
# RECOVERY_ACTIONS_EVERY_S.
RECOVERY_ACTION_TTL_S = env_int("RECOVERY_ACTION_TTL_S", 3600, minimum=1)
RECOVERY_READ_ACTIONS_ONE_CONFIRMATION = env_bool("RECOVERY_READ_ACTIONS_ONE_CONFIRMATION", True)
RECOVERY_ACTION_LEASE_S = env_int("RECOVERY_ACTION_LEASE_S", 120, minimum=5)
RECOVERY_ACTIONS_EVERY_S = env_int("RECOVERY_ACTIONS_EVERY_S", 5, minimum=1)

# Where `make run` serves the sandbox provider (manage.py runsandbox), and so where the shipped sandbox registry's
# provider points: the demo registry follows it (recovery.devtools.drills.stage.demo_registry).
RECOVERY_SANDBOX_ADDR = env_host_port("RECOVERY_SANDBOX_ADDR", "127.0.0.1:8001")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# Static files are served by the web process through WhiteNoise (no proxy needed; nginx may serve STATIC_ROOT too).
# In production (DEBUG off) `manage.py collectstatic` writes them to STATIC_ROOT with content-hashed names and
# gzip/brotli copies, cached by browsers forever; with DEBUG on they are read from the source folders as they are.
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("RECOVERY_STATIC_ROOT", str(VAR_DIR / "static")))
if DEBUG:  # read from the source folders; an empty STATIC_ROOT keeps WhiteNoise from warning that it is missing
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

LOGIN_URL = "/sign-in/"
LOGIN_REDIRECT_URL = "/"
# Sign-in throttling: this many failures for one username (or from one address) within the window lock it out
# for the rest of the window.
RECOVERY_SIGN_IN_MAX_FAILURES = env_int("RECOVERY_SIGN_IN_MAX_FAILURES", 5, minimum=1)
RECOVERY_SIGN_IN_WINDOW_S = env_int("RECOVERY_SIGN_IN_WINDOW_S", 900, minimum=1)
# How long a reviewer's claim on a queue item lasts unless renewed or released.
RECOVERY_CLAIM_S = env_int("RECOVERY_CLAIM_S", 900, minimum=30)
# The compensation problems queue lists a COMPENSATING call once its open entry has waited this long made, in flight
# or unknown (an entry in review is listed at once; a failed or partial compensation always is).
RECOVERY_COMPENSATION_STUCK_S = env_int("RECOVERY_COMPENSATION_STUCK_S", 300, minimum=1)
# Due times (docs/notifications.md#due-times), per call risk (recovery.models.Risk) and, optionally, per queue: an item
# waiting for a person is due to be resolved RECOVERY_SLA_S after it entered its state (the overview counts breaches)
# and claimed RECOVERY_CLAIM_DUE_S after (unclaimed past it: the unclaimed_overdue event, for escalation rules).
# "high=900,low=14400,human-review.high=600": every risk once; "<queue>.<risk>" overrides the risk's in that queue.
RECOVERY_SLA_S = env_seconds_by_key(
    "RECOVERY_SLA_S", {"high": 900, "low": 14_400}, keys=("high", "low"), scopes=tuple(DUE_QUEUES)
)
RECOVERY_CLAIM_DUE_S = env_seconds_by_key(
    "RECOVERY_CLAIM_DUE_S", {"high": 300, "low": 3_600}, keys=("high", "low"), scopes=tuple(DUE_QUEUES)
)

# Notifications (docs/notifications.md): links in messages start with CONSOLE_BASE_URL; webhook and Slack hosts must be
# on RECOVERY_NOTIFY_HOSTS (a name, or ".suffix" for its subdomains); the notifications job runs every
# RECOVERY_NOTIFY_EVERY_S and retries a failed delivery with backoff up to RECOVERY_NOTIFY_MAX_TRIES times.
CONSOLE_BASE_URL = env_str("CONSOLE_BASE_URL", "http://127.0.0.1:8000").rstrip("/")
RECOVERY_NOTIFY_HOSTS = env_list("RECOVERY_NOTIFY_HOSTS", ["slack.com"])
RECOVERY_NOTIFY_EVERY_S = env_int("RECOVERY_NOTIFY_EVERY_S", 5, minimum=1)
RECOVERY_NOTIFY_MAX_TRIES = env_int("RECOVERY_NOTIFY_MAX_TRIES", 8, minimum=1)
RECOVERY_NOTIFY_BACKOFF_S = env_int("RECOVERY_NOTIFY_BACKOFF_S", 10, minimum=1)
RECOVERY_NOTIFY_LEASE_S = env_int("RECOVERY_NOTIFY_LEASE_S", 60, minimum=5)
RECOVERY_NOTIFY_CONNECT_TIMEOUT_S = env_int("RECOVERY_NOTIFY_CONNECT_TIMEOUT_S", 5, minimum=1)
RECOVERY_NOTIFY_READ_TIMEOUT_S = env_int("RECOVERY_NOTIFY_READ_TIMEOUT_S", 10, minimum=1)
# How far back a rule added (or enabled again) looks for calls that still wait for a person, to list them in its
# first message (recovery/services/notifications.py `rule_catch_up`); 0: a new rule hears only of what comes next.
RECOVERY_NOTIFY_CATCH_UP_S = env_int("RECOVERY_NOTIFY_CATCH_UP_S", 86_400, minimum=0)
# E-mail (Django's SMTP backend): EMAIL_HOST, EMAIL_PORT, EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, EMAIL_USE_TLS.
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT_S", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "recovery-console@localhost")

# Content-Security-Policy (django-csp): scripts and styles only from this site (htmx is served from static files),
# inline scripts only with the per-response nonce, no frames, no plugins, forms post only here.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "frame-ancestors": [NONE],
        "form-action": [SELF],
    }
}

# The hot paths with raw SQL (docs/architecture.md, the data layer: recovery/statemachine/hot_path.py, the queue page's
# selector) read through their ORM twins when this is off: the benchmark times both in one run (`manage.py bench`), the
# tests hold them equal. Leave it on.
RECOVERY_HOT_PATH_SQL = env_bool("RECOVERY_HOT_PATH_SQL", True)

# API request bodies above this many bytes get 413 before anything reads them.
RECOVERY_API_MAX_BODY = env_int("RECOVERY_API_MAX_BODY", 256 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = RECOVERY_API_MAX_BODY

# The audit trail's anchors outside the database (docs/design/audit.md). Every event also carries an HMAC under the
# first key of RECOVERY_AUDIT_KEYS ("id:secret,id:secret"; older keys stay listed to verify what they signed), so
# rewriting events needs a secret the database does not hold; and the scheduler's holder writes a signed checkpoint of
# the chain heads every RECOVERY_AUDIT_CHECKPOINT_S into RECOVERY_AUDIT_CHECKPOINT_DIR, so a removed tail or a chain
# rewritten with the key is caught too, for everything older than the last checkpoint.
RECOVERY_AUDIT_KEYS = env_keyring("RECOVERY_AUDIT_KEYS", [("dev", "dev-audit-key-" + SECRET_KEY)] if DEBUG else None)
RECOVERY_AUDIT_CHECKPOINT_S = env_int("RECOVERY_AUDIT_CHECKPOINT_S", 60, minimum=1)
RECOVERY_AUDIT_CHECKPOINT_DIR = Path(env_str("RECOVERY_AUDIT_CHECKPOINT_DIR", str(VAR_DIR / "audit-checkpoints")))
# The periodic scheduler's lock (one active scheduler, a standby takes over when it lapses).
RECOVERY_SCHEDULER_LEASE_S = env_int("RECOVERY_SCHEDULER_LEASE_S", 10, minimum=2)

# API tokens are stored as HMAC-SHA256(pepper, token): a leaked table alone cannot be replayed or brute-forced offline.
RECOVERY_TOKEN_PEPPER = env_str("RECOVERY_TOKEN_PEPPER", SECRET_KEY if DEBUG else None)

if not DEBUG:
    # Production: everything `check --deploy` asks for. Behind a TLS-terminating proxy set SECURE_PROXY_SSL_HEADER.
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    if env_bool("TRUST_X_FORWARDED_PROTO", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

# Django's technical pages (DEBUG's URL list and tracebacks) instead of the console's 404 and 500 pages.
RECOVERY_TECHNICAL_ERRORS = env_bool("RECOVERY_TECHNICAL_ERRORS", False)
# The hot endpoints' answers (register, admit, report) are written as built; on, each is also checked against its
# schema and a difference is a 500 (recovery/api/answering.py). The test suite turns it on.
RECOVERY_CHECK_ANSWERS = env_bool("RECOVERY_CHECK_ANSWERS", False)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    # The API's refusals (409: admission's gate, a stale version, a call that is not reconcilable) are answers the
    # protocol expects, not trouble: logged at INFO, where Django would log every 4xx as a WARNING.
    "filters": {"expected_refusals": {"()": "console.logs.ExpectedRefusals"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    # Django's own console handler (DEBUG only) beside the root's printed every django.* line twice: one handler,
    # the root's, prints everything once.
    "loggers": {
        "django": {"handlers": [], "propagate": True},
        "django.request": {"filters": ["expected_refusals"]},
        "django.server": {"handlers": [], "propagate": True, "filters": ["expected_refusals"]},
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}
