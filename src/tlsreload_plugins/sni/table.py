"""The routing table of the SNI identities: which identity answers a handshake's server name.

The identity whose served certificate lists the server name among its DNS SANs (compared in lower case,
internationalized names in their A-label ``xn--`` form, as they appear in certificates and as Python's
``ssl`` hands them over). An exact name beats a wildcard; a wildcard ``*.example.com`` covers one label
(``a.example.com``, not ``example.com`` nor ``a.b.example.com``). A handshake without a server name, or
with one no identity lists, gets the default identity. When two identities list the same name, the first
wins: directories in the order configured, subdirectories in sorted order (a WARNING names both, once).
The lookup is two dictionary reads, whatever the number of identities. The identities themselves are
:class:`tlsreload_plugins.sni.identities.SNIIdentities`'.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Mapping

from tlsreload_plugins.reloader import Reloader

# The SNI identities' logger: a conflict between two identities is theirs to report.
log: logging.Logger = logging.getLogger("tlsreload_plugins.sni")


def host_names(sans: Iterable[str]) -> list[str]:
    """The names among a certificate's SANs a server name can match: DNS names and one-label
    wildcards, lower case, A-labels; IP addresses, URIs and e-mail addresses are left out."""
    names = []
    for san in sans:
        name = san.strip().lower().rstrip(".")
        if not name or any(c in name for c in ":/@ "):
            continue
        if not name.strip("0123456789."):  # digits and dots only: maybe an IPv4 address (IPv6 has colons)
            try:
                ipaddress.ip_address(name)
                continue
            except ValueError:
                pass
        if not name.isascii():  # a U-label where an A-label belongs: use the A-label
            try:
                name = name.encode("idna").decode("ascii")
            except UnicodeError:
                continue
        if "*" in name and not (name.startswith("*.") and "*" not in name[2:] and "." in name[2:]):
            continue  # partial or deep wildcards: not served
        names.append(name)
    return names


def routing_table(
    identities: Mapping[str, Reloader], conflicts_logged: set[tuple[str, str, str]]
) -> dict[str, Reloader]:
    """Each name the identities' served certificates list (:func:`host_names`), and the identity that answers
    it: the first of ``identities`` (in precedence order) to list it. A name claimed by two identities is
    logged once per pair (``conflicts_logged`` remembers which were)."""
    table: dict[str, Reloader] = {}
    owner: dict[str, str] = {}
    for name, reloader in identities.items():
        for host in host_names(reloader.leaf.sans):
            first = owner.get(host)
            if first is None:
                owner[host] = name
                table[host] = reloader
            elif first != name and (host, first, name) not in conflicts_logged:
                conflicts_logged.add((host, first, name))
                log.warning("SNI name %s is claimed by identities %s and %s: %s serves it", host, first, name, first)
    return table


def lookup(table: Mapping[str, Reloader], server_name: str | None) -> Reloader | None:
    """The reloader ``table`` (a :func:`routing_table`) routes ``server_name`` to: its exact name, else the
    one-label wildcard covering it, else ``None``. Two dictionary reads at most; never raises."""
    if not server_name:
        return None
    name = server_name.lower()
    reloader = table.get(name)
    if reloader is None:
        dot = name.find(".")
        if dot > 0:
            reloader = table.get("*" + name[dot:])
    return reloader
