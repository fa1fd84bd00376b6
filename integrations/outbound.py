"""Where the platform may send requests: never to its own network (SSRF guard).

Organizations and operators configure outbound URLs (runner HTTP handlers, Chatwoot, the ERP, a
Graph API override, the ESP's API, the pricing URL). Unless the deployment allows it
(`ALLOW_PRIVATE_OUTBOUND_URLS`, on in the embedded `make run` mode so its sandboxes work), a URL
whose host resolves to a loopback, private, link-local, multicast, unspecified or otherwise
reserved address is refused; every address the host resolves to is checked, and IPv4-mapped IPv6
addresses are judged by their IPv4 address. Numeric hosts in any form the resolver accepts
(decimal `2130706433`, octal `0177.0.0.1`, hex `0x7f.1`) are resolved like names, so they are judged
by the address they mean.

The check runs when a URL or an SMTP host is saved (`validate_outbound_url`,
`validate_outbound_host`) and again at every connection, since a name may resolve elsewhere later:
`peer_addresses` is the one guard every client connects through — httpx (integrations.http's
transport), aiohttp (its connector), requests inside anymail (its adapter), smtplib
(integrations.email.smtp) — so what is checked is the address actually connected to, on the first
request and on every redirect hop, whatever notation names the host. A name whose answer changes
between a check and a connection (DNS rebinding) cannot pass public and connect private: the
lookup checked is the lookup connected with. An origin an operator named on the command line
(`demo --graph-url/--erp-url/--smtp`, the sandboxes of `up`) is trusted in every mode
(`trust_origin`); the integrations app keeps those origins in its TrustedOrigin table and hands
this module the store (`use_trusted_origin_store`).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils.translation import gettext as _

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str], Iterable[str]]
CACHE_SECONDS = 60.0


class OutboundURLError(ValueError):
    """A URL the platform must not call."""


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: an IPv4 address behind a NAT64 gateway


def forbidden_address(address: Address) -> bool:
    """True for an address inside the platform's own networks or no one's (an IPv6 address that
    carries an IPv4 one — mapped, 6to4, NAT64 — is judged by the IPv4 address)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if isinstance(address, ipaddress.IPv6Address) and address.sixtofour is not None:
        address = address.sixtofour
    if isinstance(address, ipaddress.IPv6Address) and address in _NAT64:
        address = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or address.is_reserved
        or not address.is_global
    )


def system_resolver(host: str) -> list[str]:
    """Every address `host` resolves to (names, and numeric forms as the C library reads them)."""
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]).split("%", 1)[0] for info in infos]


_trusted: tuple[float, frozenset[str]] = (0.0, frozenset())
_trusted_lock = threading.Lock()


@dataclass(frozen=True)
class TrustedOriginStore:
    load: Callable[[], Iterable[str]]  # every trusted origin
    add: Callable[[str], None]  # keep one more (safe to repeat)


_store: TrustedOriginStore | None = None


def use_trusted_origin_store(store: TrustedOriginStore) -> None:
    """Where trusted origins are kept (IntegrationsConfig.ready: the TrustedOrigin table). Until
    then no origin is trusted."""
    global _store, _trusted
    with _trusted_lock:
        _store, _trusted = store, (0.0, frozenset())


def _origin(url: str) -> str:
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    return f"{parts.scheme.lower()}://{host}:{port}"


def trust_origin(url: str) -> None:
    """Allow `url`'s origin (scheme, host, port) whatever it resolves to: an operator's explicit
    choice on the command line. Kept in the database (integrations.TrustedOrigin)."""
    if _store is None:
        raise RuntimeError("no trusted origin store: the integrations app is not installed")
    _store.add(_origin(url))
    global _trusted
    with _trusted_lock:
        _trusted = (0.0, frozenset())


def trusted_origins() -> frozenset[str]:
    global _trusted
    with _trusted_lock:
        loaded_at, origins = _trusted
        if time.monotonic() - loaded_at < CACHE_SECONDS and loaded_at:
            return origins
    origins = frozenset(_store.load()) if _store is not None else frozenset()
    with _trusted_lock:
        _trusted = (time.monotonic(), origins)
    return origins


def _callable_host(url: str) -> str:
    """The host of an http(s) URL; OutboundURLError for another scheme or no host."""
    parts = urlsplit(url.strip())
    if parts.scheme.lower() not in ("http", "https"):
        raise OutboundURLError(_("Only http and https URLs can be called."))
    if not parts.hostname:
        raise OutboundURLError(_("The URL names no host."))
    return parts.hostname


def check_scheme(url: str) -> None:
    """OutboundURLError unless `url` is http(s) with a host."""
    _callable_host(url)


def is_literal(host: str) -> bool:
    """Whether `host` is an IP address itself (nothing to resolve)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def check_url(url: str, *, resolver: Resolver = system_resolver, allow_private: bool | None = None) -> None:
    """Raise OutboundURLError unless `url` is http(s) to a host whose every address is public."""
    host = _callable_host(url)
    if allow_private is None:
        allow_private = settings.ALLOW_PRIVATE_OUTBOUND_URLS
    if allow_private:
        return
    check_host(host, resolver=resolver)


def check_host(host: str, *, resolver: Resolver = system_resolver) -> list[Address]:
    """Every address of `host`; OutboundURLError unless every one is public."""
    try:
        literal: Address | None = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    else:
        try:
            addresses = [ipaddress.ip_address(a) for a in resolver(host)]
        except (OSError, UnicodeError, ValueError) as exc:
            raise OutboundURLError(
                _("%(host)s does not resolve: %(error)s") % {"host": host, "error": exc}
            ) from None
        if not addresses:
            raise OutboundURLError(_("%(host)s does not resolve.") % {"host": host})
    for address in addresses:
        if forbidden_address(address):
            raise forbidden(host, address)
    return addresses


def forbidden(host: str, address: Address) -> OutboundURLError:
    return OutboundURLError(
        _("%(host)s is a private, loopback or reserved address (%(address)s): not allowed here.")
        % {"host": host, "address": address}
    )


def check_request_url(url: str, *, resolver: Resolver = system_resolver) -> None:
    """OutboundURLError unless `url` may be called now (the clients check the address they
    connect to again, through `peer_addresses`)."""
    check_scheme(url)
    if settings.ALLOW_PRIVATE_OUTBOUND_URLS or _origin(url) in trusted_origins():
        return
    check_host(_callable_host(url), resolver=resolver)


def check_peers(host: str, port: int, addresses: Iterable[str]) -> None:
    """OutboundURLError unless a connection to `host:port` may be made to every one of `addresses`
    (what a client resolved it to)."""
    if settings.ALLOW_PRIVATE_OUTBOUND_URLS:
        return
    parsed = [ipaddress.ip_address(a.split("%", 1)[0]) for a in addresses]
    bad = [a for a in parsed if forbidden_address(a)]
    if bad and not trusted_host(host, port):
        raise forbidden(host, bad[0])


def trusted_host(host: str, port: int) -> bool:
    """Whether an operator trusted `host:port` (any scheme): for a connector that knows no URL."""
    suffix = f"://{host.lower().strip('[]')}:{port}"
    return any(origin.endswith(suffix) for origin in trusted_origins())


def validate_outbound_host(host: str, port: int, *, field: str) -> None:
    """Model validation of a host a connection is made to (an organization's SMTP server): every
    address public, unless the deployment allows private ones or an operator trusted host and port."""
    try:
        peer_addresses(host.strip(), port)
    except OutboundURLError as exc:
        raise ValidationError({field: str(exc)}, code="outbound_host") from None


def validate_outbound_url(value: str) -> None:
    """Model field validator: the URL an organization or operator types must be callable."""
    if not value:
        return
    if _origin(value) in trusted_origins():
        return
    try:
        check_url(value)
    except OutboundURLError as exc:
        raise ValidationError(str(exc), code="outbound_url") from None


def peer_addresses(host: str, port: int, *, resolver: Resolver = system_resolver) -> list[str]:
    """The addresses a connection to `host:port` may be made to, in order: the host itself when any
    address may be used (the deployment allows private addresses, or an operator trusted the host
    and port); else every address the host resolves to — names and numeric hosts in any notation
    alike — each one public, or OutboundURLError. Connecting to exactly these (never to a second
    lookup of the name) is what makes the check hold against DNS rebinding."""
    if settings.ALLOW_PRIVATE_OUTBOUND_URLS:
        return [host]
    bare = host.strip("[]")
    if not bare:
        raise OutboundURLError(_("The URL names no host."))
    if trusted_host(bare, port):
        return [host]
    return [str(address) for address in check_host(bare, resolver=resolver)]


def create_connection(
    address: tuple[str, int],
    timeout: float | None = None,
    source_address: tuple[str, int] | None = None,
    *,
    socket_options: Iterable[tuple[int, int, int | bytes]] | None = None,
) -> socket.socket:
    """socket.create_connection through the guard: a TCP connection to the first of
    `peer_addresses` that answers. Every client that connects to an address an organization, an
    operator or a setting chose connects through this (integrations.http: httpx, aiohttp, requests;
    integrations.email.smtp: smtplib). Raises OutboundURLError before any packet leaves for a
    forbidden address, else what socket.create_connection raises."""
    host, port = address
    error: OSError | None = None
    for peer in peer_addresses(host, port):
        try:
            sock = socket.create_connection((peer, port), timeout, source_address)
        except OSError as exc:
            error = exc
            continue
        for option in socket_options or ():
            sock.setsockopt(*option)
        return sock
    raise error or OSError(f"no address to connect to for {host}")
