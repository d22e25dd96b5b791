"""Django settings for Mado Compute. Every knob comes from an MADO_* environment variable."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

from django.utils.translation import gettext_lazy as _

from mado import env

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env.env_str("MADO_VAR_DIR", "").strip() or str(BASE_DIR / "var"))

VERSION = "0.1.0"

DEBUG = env.env_bool("MADO_DEBUG", False)
DEV_MODE = env.env_bool("MADO_DEV_MODE", False)
SECRET_KEY = env.secret_key("MADO_SECRET_KEY", VAR_DIR / "secret_key")
PUBLIC_URL = env.env_url("MADO_PUBLIC_URL", "http://127.0.0.1:8000")
ALLOWED_HOSTS = env.env_list("MADO_ALLOWED_HOSTS", ["127.0.0.1", "localhost"])

_public = urlparse(PUBLIC_URL)
HTTPS = _public.scheme == "https"
CSRF_TRUSTED_ORIGINS = [f"{_public.scheme}://{_public.netloc}"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "mado",
    "computers",
    "workers",
    "jobs",
    "tracking",
    "registry",
    "sites",
    "datasets",
    "notifications",
    "monitoring",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # django-axes' middleware last, as it asks: it turns a refused sign-in into the lock-out page.
    "mado.authentication.axes_request_middleware",
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "mado.urls"
WSGI_APPLICATION = "mado.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "mado.context_processors.navigation",
            ],
        },
    },
]

DATABASES = {"default": env.database("MADO_DATABASE_URL", VAR_DIR / "mado.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The sign-in limit comes first: it refuses a locked-out sign-in before the password is checked.
AUTHENTICATION_BACKENDS = ["mado.authentication.SignInLimitBackend", "mado.authentication.HumanOnlyModelBackend"]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
LANGUAGES = [("en", _("English")), ("ja", _("Japanese"))]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = env.env_time_zone("MADO_TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Apart from MADO_VAR_DIR so an image can collect its static files at build time while the state directory is
# a volume that would keep an old copy across upgrades.
STATIC_ROOT = Path(env.env_str("MADO_STATIC_ROOT", "").strip() or str(VAR_DIR / "static"))
# MADO_SERVE_STATIC: gunicorn serves what collectstatic put in STATIC_ROOT itself (WhiteNoise, right after the
# security middleware so its redirects and headers apply first), compressed and under content-hashed names browsers
# may cache for a year; no proxy rule to keep in step. Off where nothing is collected (`make run` serves the
# checkout's files through runserver, the test suite needs none): the manifest storage refuses to render a page
# whose file is not in its manifest.
SERVE_STATIC = env.env_bool("MADO_SERVE_STATIC", False)
if SERVE_STATIC:
    MIDDLEWARE.insert(MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
                      "whitenoise.middleware.WhiteNoiseMiddleware")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage" if SERVE_STATIC
                    else "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# Worker outputs carry a manifest of up to 10 000 lines of 4 KiB: JSON bodies up to 48 MiB.
DATA_UPLOAD_MAX_MEMORY_SIZE = 48 * 2**20
MEDIA_ROOT = Path(env.env_str("MADO_MEDIA_ROOT", str(VAR_DIR / "media")))
# The agent distribution served at /downloads/ (manage.py build_agent); the server image keeps it in the image.
DOWNLOADS_DIR = Path(env.env_str("MADO_DOWNLOADS_DIR", "").strip() or str(VAR_DIR / "downloads"))

# Security: an https public URL switches on everything a TLS deployment needs.
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS and env.env_bool("MADO_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = env.env_int("MADO_HSTS_SECONDS", 31536000 if HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
BEHIND_PROXY = env.env_bool("MADO_BEHIND_PROXY", False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if BEHIND_PROXY else None
SECURE_CONTENT_TYPE_NOSNIFF = True
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "mado.authentication.BearerTokenAuthentication",
        "mado.authentication.BrowserSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["mado.permissions.ScopePermission"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["mado.parsers.StrictJSONParser"],
    "EXCEPTION_HANDLER": "mado.exceptions.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_RATES": {"token_issue": env.env_rate("MADO_TOKEN_ISSUE_RATE", "30/min")},
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Mado Compute API",
    "DESCRIPTION": "Computers, workers, jobs and sites of the Mado ML-tracking platform.",
    "VERSION": VERSION,
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Vendored Swagger UI: the docs page must work without reaching a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # The worker's and the site runner's heartbeat and completion bodies share these value sets.
    "ENUM_NAME_OVERRIDES": {
        "HeartbeatStatusEnum": ["running"],
        "EndStatusEnum": ["finished", "failed", "canceled"],
    },
}

# Guessing passwords and tokens (docs/configuration.md, "Sign-in and token limits"). django-axes counts
# failed sign-ins per username *and* address in its AccessAttempt table (listed in Django admin, where a
# global administrator unlocks by deleting the row); mado.authentication adds the per-address limit and
# counts unknown API tokens per address in the same table.
LOGIN_FAILURE_LIMIT = env.env_int("MADO_LOGIN_FAILURE_LIMIT", 5, minimum=1)
LOGIN_ADDRESS_FAILURE_LIMIT = env.env_int("MADO_LOGIN_ADDRESS_FAILURE_LIMIT", 30, minimum=1)
LOGIN_COOLOFF_MINUTES = env.env_int("MADO_LOGIN_COOLOFF_MINUTES", 15, minimum=1)
TOKEN_FAILURE_LIMIT = env.env_int("MADO_TOKEN_FAILURE_LIMIT", 20, minimum=1)
TOKEN_COOLOFF_MINUTES = env.env_int("MADO_TOKEN_COOLOFF_MINUTES", 15, minimum=1)
AXES_ENABLED = True
AXES_HANDLER = "mado.authentication.SignInAttemptHandler"
AXES_FAILURE_LIMIT = LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=LOGIN_COOLOFF_MINUTES)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# Attempts refused during a lock-out are not counted: the cool-off runs from the lock-out, as the page says.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_CLIENT_IP_CALLABLE = "mado.authentication.client_address"
AXES_LOCKOUT_CALLABLE = "mado.views.sign_in_locked_out"
AXES_SENSITIVE_PARAMETERS = ["username", "ip_address", "csrfmiddlewaretoken"]
AXES_VERBOSE = False  # no start-up banner on every manage.py command

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.env_choice("MADO_LOG_LEVEL", "INFO", ["DEBUG", "INFO", "WARNING", "ERROR"])},
}

# Prometheus metrics (docs/monitoring.md): addresses that may scrape /metrics without a token (IPs or CIDRs).
METRICS_ALLOWED_ADDRESSES = env.env_list("MADO_METRICS_ALLOWED_ADDRESSES", [])

# How often a token's last_used_at is written: every request would turn reads into writes.
TOKEN_LAST_USED_RESOLUTION_SECONDS = 60
TOKEN_MAX_DAYS = 365
MAX_SOURCE_BYTES = env.env_int("MADO_MAX_SOURCE_MIB", 512, minimum=1) * 2**20
# The most output files the server accepts from a job, whatever the worker's MMT_WORKER_MAX_OUTPUT_FILES (seed
# 001's setting, 10 000 by default) allows: a ceiling above that default, so raising the worker's setting works.
MAX_OUTPUT_FILES = env.env_int("MADO_MAX_OUTPUT_FILES", 100_000, minimum=1)

# Notifications (docs/notifications.md): e-mail through Django's SMTP backend, signed webhooks, retries.
# NOTIFICATION_EMAIL_BACKEND is separate from EMAIL_BACKEND, which the test runner swaps for memory.
NOTIFICATION_EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = env.env_str("MADO_EMAIL_HOST", "localhost")
EMAIL_PORT = env.env_int("MADO_EMAIL_PORT", 25, minimum=1, maximum=65535)
EMAIL_HOST_USER = env.env_str("MADO_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = env.env_str("MADO_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env.env_bool("MADO_EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env.env_int("MADO_EMAIL_TIMEOUT_SECONDS", 10, minimum=1, maximum=300)
DEFAULT_FROM_EMAIL = env.env_str("MADO_EMAIL_FROM", f"Mado Compute <mado@{_public.hostname or 'localhost'}>")
NOTIFICATION_WEBHOOK_TIMEOUT_SECONDS = env.env_int("MADO_WEBHOOK_TIMEOUT_SECONDS", 10, minimum=1, maximum=60)
NOTIFICATION_RETRY_BASE_SECONDS = env.env_int("MADO_NOTIFICATION_RETRY_BASE_SECONDS", 30, minimum=1)
NOTIFICATION_RETRY_HOURS = env.env_int("MADO_NOTIFICATION_RETRY_HOURS", 24, minimum=1)
