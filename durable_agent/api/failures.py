"""Failed token authentications: logged, counted and limited per client address.

Every request whose ``Authorization: Bearer`` token is refused is logged on
``durable_agent.api`` (the client address and the reason, never any part of the secret) and
counted against its client address. Once an address has ``API_AUTH_FAILURES_PER_MINUTE``
failures in the current clock minute, its token requests are answered 429 ``throttled`` with
``Retry-After`` (the seconds left in that minute) before any token is looked up, whether the
token is good or not. Session requests and requests without credentials are not counted.

Note [Failure counts live in Django's cache]
    The counts are kept in Django's ``default`` cache, one key per address and minute. With a
    cache shared by every process (Redis, Memcached, the database cache), the limit holds for
    the whole deployment. With the default ``LocMemCache`` each process counts on its own, so
    N processes allow up to N times the limit; a cache that is down or cleared forgets the
    counts. The window is fixed (a clock minute, read from ``durable_agent.clock``), so an
    address can fail up to twice the limit across a minute boundary.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest

from durable_agent import clock, conf

logger = logging.getLogger("durable_agent.api")

WINDOW_SECONDS = 60
_KEY = "durable_agent:api-auth-failures:{address}:{window}"


def client_address(request: HttpRequest) -> str:
    """The address failures are counted against: ``REMOTE_ADDR``, or, when the project sets
    ``NINJA_NUM_PROXIES`` (django-ninja's setting for its own throttles), the address that
    many proxies back in ``X-Forwarded-For``. Without that setting the header is ignored: a
    client could otherwise pick a new address for every guess."""
    remote = str(request.META.get("REMOTE_ADDR") or "unknown")
    proxies = getattr(settings, "NINJA_NUM_PROXIES", None)
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR")
    if not isinstance(proxies, int) or proxies <= 0 or not forwarded:
        return remote
    hops = [hop.strip() for hop in str(forwarded).split(",") if hop.strip()]
    if not hops:
        return remote
    return hops[-min(proxies, len(hops))][:100]


def _window(now: datetime) -> tuple[int, int]:
    """The current window's number and the whole seconds left in it (at least 1)."""
    seconds = int(now.timestamp())
    return seconds // WINDOW_SECONDS, WINDOW_SECONDS - seconds % WINDOW_SECONDS


def _key(address: str, window: int) -> str:
    # Hashed: cache backends restrict key characters and lengths; an address is free text
    # when it comes from X-Forwarded-For.
    digest = hashlib.sha256(address.encode("utf-8", "replace")).hexdigest()[:32]
    return _KEY.format(address=digest, window=window)


def retry_after(request: HttpRequest) -> int | None:
    """Seconds until this client may try a token again, or None when it may now."""
    limit = conf.api_auth_failures_per_minute()
    if limit <= 0:
        return None
    address = client_address(request)
    window, left = _window(clock.now())
    key = _key(address, window)
    if int(cache.get(key, 0)) < limit:
        return None
    if cache.add(f"{key}:reported", 1, timeout=WINDOW_SECONDS + 1):
        logger.warning(
            "API token authentication refused from %s for %d s: %d failures this minute",
            address,
            left,
            limit,
            extra={"action": "api_auth_throttled", "client": address, "retry_after": left},
        )
    return left


def record(request: HttpRequest, reason: str) -> None:
    """Log a refused token (``reason`` says why; it never holds the secret) and count it."""
    address = client_address(request)
    logger.warning(
        "API token authentication failed from %s: %s",
        address,
        reason,
        extra={"action": "api_auth_failed", "client": address, "reason": reason},
    )
    if conf.api_auth_failures_per_minute() <= 0:
        return
    window, _left = _window(clock.now())
    key = _key(address, window)
    cache.add(key, 0, timeout=WINDOW_SECONDS + 1)
    try:
        cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=WINDOW_SECONDS + 1)
