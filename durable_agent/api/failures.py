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
    N processes allow up to N times the limit; a cache that is cleared forgets the counts. The
    window is fixed (a clock minute, read from ``durable_agent.clock``), so an address can fail
    up to twice the limit across a minute boundary.

Note [The limit fails open]
    A cache that raises (Redis down, a full Memcached, a broken database cache) turns the limit
    off for that request: the token is checked as if no failure had been counted, so valid
    tokens keep working while the cache is down. The first such error is logged (ERROR, with
    the exception) once per process; later ones are not, so an outage does not write a line
    per request. Refused tokens are still logged one by one.

Note [Whose address counts]
    Failures are counted against ``REMOTE_ADDR``, the peer of the connection. A proxy in front
    of Django makes every client share the proxy's address, so a project lists its proxies in
    ``API_TRUSTED_PROXIES`` (addresses or networks): a request whose peer is one of them is
    counted against the rightmost ``X-Forwarded-For`` hop that is not. ``X-Forwarded-For`` from
    any other peer is the client's to write and is ignored. django-ninja's
    ``NINJA_NUM_PROXIES`` is not used: it trusts the header whoever sent it, so with Django
    reachable directly a client could pick a fresh address for each guess, or lock out any
    address it names.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime
from ipaddress import IPv4Network, IPv6Network, ip_address, ip_network

from django.core.cache import cache
from django.http import HttpRequest

from durable_agent import clock, conf

logger = logging.getLogger("durable_agent.api")

WINDOW_SECONDS = 60
_KEY = "durable_agent:api-auth-failures:{address}:{window}"
_cache_error_logged = False


def _cache_failed(exc: Exception) -> None:
    """Note a cache error: logged the first time in this process only (Note [The limit fails
    open])."""
    global _cache_error_logged
    if _cache_error_logged:
        return
    _cache_error_logged = True
    logger.error(
        "The cache failed (%s: %s); refused API tokens are not limited while it fails "
        "(logged once per process)",
        type(exc).__name__,
        exc,
        exc_info=exc,
        extra={"action": "api_auth_limit_off"},
    )


def _networks() -> tuple[IPv4Network | IPv6Network, ...]:
    return tuple(ip_network(str(entry), strict=False) for entry in conf.api_trusted_proxies())


def _trusted(address: str, networks: tuple[IPv4Network | IPv6Network, ...]) -> bool:
    try:
        parsed = ip_address(address)
    except ValueError:
        return False
    return any(parsed in network for network in networks)


def client_address(request: HttpRequest) -> str:
    """The address failures are counted against (Note [Whose address counts]):
    ``REMOTE_ADDR``, or, when that peer is a trusted proxy, the rightmost ``X-Forwarded-For``
    hop that is not one."""
    remote = str(request.META.get("REMOTE_ADDR") or "unknown")
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR")
    networks = _networks()
    if not networks or not forwarded or not _trusted(remote, networks):
        return remote
    hops = [hop.strip() for hop in str(forwarded).split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, networks):
            return hop[:100]
    return hops[0][:100] if hops else remote


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
    try:
        if int(cache.get(key, 0)) < limit:
            return None
        first = cache.add(f"{key}:reported", 1, timeout=WINDOW_SECONDS + 1)
    except Exception as exc:  # any cache backend's error: fail open (Note [The limit fails open])
        _cache_failed(exc)
        return None
    if first:
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
    try:
        cache.add(key, 0, timeout=WINDOW_SECONDS + 1)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, timeout=WINDOW_SECONDS + 1)
    except Exception as exc:  # any cache backend's error: fail open (Note [The limit fails open])
        _cache_failed(exc)
