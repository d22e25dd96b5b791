"""Typed readers for settings that come from the environment.

A bad value stops start-up with a message naming the variable, instead of surfacing later as an
odd behaviour: an operator reading the traceback must see which variable to fix.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false (got {raw!r}).")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number (got {raw!r}).") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum} (got {value}).")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum} (got {value}).")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    values = [item.strip() for item in raw.split(",") if item.strip()]
    if not values:
        raise ImproperlyConfigured(f"{name} is set but empty; give at least one value, or unset it for the default.")
    return values


def env_url(name: str, default: str = "") -> str:
    raw = os.environ.get(name, "").strip() or default
    if raw and not (raw.startswith("http://") or raw.startswith("https://")):
        raise ImproperlyConfigured(f"{name} must start with http:// or https:// (got {raw!r}).")
    return raw.rstrip("/")


def secret_key(name: str, fallback_file: Path) -> str:
    """The secret key from the environment, or one generated once into a file for the demo."""
    value = os.environ.get(name, "").strip()
    if value:
        if len(value) < 50:
            raise ImproperlyConfigured(f"{name} must be at least 50 characters long.")
        return value
    if fallback_file.exists():
        return fallback_file.read_text().strip()
    fallback_file.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(64)
    fd = os.open(fallback_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
    return value


def database(name: str, default_sqlite: Path) -> dict:
    import dj_database_url

    raw = os.environ.get(name, "").strip()
    if not raw:
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(default_sqlite),
                "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20}}
    if not raw.startswith(("postgres://", "postgresql://", "sqlite:///")):
        raise ImproperlyConfigured(
            f"{name} must be postgres://user@host:port/db or sqlite:///path (got a {raw.split(':')[0]!r} URL)."
        )
    config = dj_database_url.parse(raw, conn_max_age=env_int("MADO_DB_CONN_MAX_AGE", 60, minimum=0),
                                   conn_health_checks=True)
    if config["ENGINE"].endswith("sqlite3"):
        config["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20}
        return config
    # A pool per server process (psycopg_pool, through Django): threads share at most this many
    # connections, so a server with hundreds of threads for workers' long-polls stays within PostgreSQL's
    # max_connections (docs/deployment.md). Django keeps no persistent connection beside a pool.
    pool_size = env_int("MADO_DB_POOL_SIZE", 0, minimum=0, maximum=1000)
    if pool_size:
        config["CONN_MAX_AGE"] = 0
        config["CONN_HEALTH_CHECKS"] = False
        config.setdefault("OPTIONS", {})["pool"] = {
            "min_size": min(2, pool_size), "max_size": pool_size,
            "timeout": env_int("MADO_DB_POOL_TIMEOUT_SECONDS", 30, minimum=1, maximum=600)}
    return config


def env_choice(name: str, default: str, choices: list[str]) -> str:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    for choice in choices:
        if raw.lower() == choice.lower():
            return choice
    raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)} (got {raw!r}).")


def env_rate(name: str, default: str) -> str:
    """A DRF throttle rate such as 30/min."""
    raw = os.environ.get(name, "").strip() or default
    count, _, period = raw.partition("/")
    if not count.isdigit() or int(count) < 1 or period not in {"s", "sec", "second", "m", "min", "minute", "h",
                                                             "hour", "d", "day"}:
        raise ImproperlyConfigured(f"{name} must look like 30/min (a count, '/', and s, min, hour or day; got {raw!r}).")
    return raw


def env_time_zone(name: str, default: str) -> str:
    import zoneinfo

    raw = os.environ.get(name, "").strip() or default
    try:
        zoneinfo.ZoneInfo(raw)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ImproperlyConfigured(f"{name} must be an IANA time zone such as UTC or Asia/Tokyo (got {raw!r}).") from None
    return raw
