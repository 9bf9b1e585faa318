"""Which network interface a rank's gloo connections use: one the other nodes can reach.

gloo binds each rank to the address its hostname resolves to and tells the other ranks that address. On nodes
whose hosts file maps the node's own name to a loopback address (Debian's installer writes ``127.0.1.1 NAME``),
every rank would publish loopback and no rank on another node could connect. Here such a rank picks the
interface its kernel routes to another node of the job through, and names it in ``GLOO_SOCKET_IFNAME``.
Standard library only (Linux ioctls): it runs on every rank before the process group exists.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass

GLOO_IFNAME_ENV = "GLOO_SOCKET_IFNAME"
_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address


@dataclass(frozen=True)
class InterfaceChoice:
    """The interface chosen for gloo, its address on this node, and why it was needed (for the log line)."""

    name: str
    address: str
    reason: str


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def resolve(host: str) -> list[str]:
    """The IPv4 addresses ``host`` resolves to here, in the resolver's order ([] when it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def interface_addresses() -> dict[str, str]:
    """Each interface's IPv4 address (interfaces without one are left out)."""
    found: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            found[name] = socket.inet_ntoa(packed[20:24])
    return found


def route_source(address: str) -> str | None:
    """The local address the kernel would send from to reach ``address`` (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return None


def _short(host: str) -> str:
    return host.split(".", 1)[0]


def choose_interface(own_host: str, peers: Iterable[str]) -> InterfaceChoice | None:
    """The interface to announce when ``own_host`` resolves first to loopback here (or not at all), else None
    (gloo's own choice works): the one routing to the first peer node that resolves to a non-loopback address."""
    own = resolve(own_host)
    if own and not is_loopback(own[0]):  # gloo binds to the first address that resolves
        return None
    shown = f"first to {own[0]} (loopback)" if own else "to no address"
    by_address = {address: name for name, address in interface_addresses().items()}
    for peer in peers:
        if _short(peer) == _short(own_host):
            continue
        for address in resolve(peer):
            if is_loopback(address):
                continue
            source = route_source(address)
            name = by_address.get(source or "")
            if source and name and not is_loopback(source):
                return InterfaceChoice(name, source, f"{own_host} resolves {shown} here; {name} reaches {peer}")
    return None


def set_gloo_interface(environ: MutableMapping[str, str], own_host: str, nodes: list[str]) -> InterfaceChoice | None:
    """Set ``GLOO_SOCKET_IFNAME`` for a job on several nodes where this node's name resolves to loopback; a value
    the user or the site set is kept. Returns the choice made (None: nothing set)."""
    if environ.get(GLOO_IFNAME_ENV) or len({_short(n) for n in nodes}) < 2:
        return None
    choice = choose_interface(own_host, nodes)
    if choice is not None:
        environ[GLOO_IFNAME_ENV] = choice.name
    return choice


def describe(choice: InterfaceChoice) -> str:
    return (f"gloo uses {choice.name} ({choice.address}): {choice.reason} "
            f"(set {GLOO_IFNAME_ENV} to choose another)")
