"""Who may read /metrics besides a global administrator's token: the addresses the operator listed in
METRICS_ALLOWED_ADDRESSES (MADO_METRICS_ALLOWED_ADDRESSES), IP addresses or networks in CIDR notation."""
from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from mado.authentication import client_address

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def configured_entries() -> tuple[str, ...]:
    entries = getattr(settings, "METRICS_ALLOWED_ADDRESSES", None) or ()
    if isinstance(entries, str):  # one value written without the list around it
        entries = entries.split(",")
    return tuple(str(entry).strip() for entry in entries if str(entry).strip())


@lru_cache(maxsize=8)
def parse_networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"MADO_METRICS_ALLOWED_ADDRESSES: {entry!r} is neither an IP address nor a network such as "
                "10.0.0.0/8 or fd00::/8; fix that entry (the list is comma-separated).") from None
    return tuple(networks)


def allowed_networks() -> tuple[Network, ...]:
    return parse_networks(configured_entries())


def from_allowed_address(request) -> bool:
    """The client's address as the sign-in limits count it (the proxy's X-Forwarded-For entry behind
    MADO_BEHIND_PROXY), within one of the listed networks."""
    networks = allowed_networks()
    address = client_address(request) if networks else None
    if address is None:
        return False
    ip = ipaddress.ip_address(address)
    # A server listening on [::] sees IPv4 clients as ::ffff:a.b.c.d; the list names them as IPv4.
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return any(ip in network for network in networks)
