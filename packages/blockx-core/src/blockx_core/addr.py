"""``host:port`` addresses as Workers, Coordinators and listeners spell them."""

from __future__ import annotations

from typing import Final

# etcd's client port, for an endpoint that names none.
DEFAULT_ETCD_PORT: Final = 2379
# The request header naming the Worker (its ``host:port``) a worker.v1 call sent
# through a proxy is for: the client sets it, ``blockx-proxy`` routes by it.
WORKER_ADDR_HEADER: Final = "x-blockx-worker-addr"
_HTTP_SCHEMES: Final = ("http://", "https://")


class InvalidAddress(ValueError):
    """Not a ``host:port`` (or ``[v6]:port``, or ``:port``) address."""


# Characters of URLs, lists and brackets, which no host name or address holds.
_NOT_IN_HOSTS = frozenset("[]/\\@?#,;'\"<>")


def split_host_port(addr: str, *, allow_empty_host: bool = False) -> tuple[str, int]:
    """Split ``host:port``, ``[::1]:port`` or (with ``allow_empty_host``) ``:port``.

    An empty host means every interface; it is returned as ``""``.
    """
    if "://" in addr:
        raise InvalidAddress(f"{addr!r}: write host:port, without a scheme")
    host, sep, port_text = addr.rpartition(":")
    if not sep:
        raise InvalidAddress(f"{addr!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise InvalidAddress(f"{addr!r}: write an IPv6 host in brackets, e.g. [::1]:8080")
    if not host and not allow_empty_host:
        raise InvalidAddress(f"{addr!r} has no host")
    if any(c in _NOT_IN_HOSTS or not c.isprintable() or c.isspace() for c in host):
        raise InvalidAddress(f"{addr!r} has no valid host (a name, an IPv4 or a [v6] address)")
    if not (port_text.isascii() and port_text.isdigit()) or not 0 <= int(port_text) <= 65535:
        raise InvalidAddress(f"{addr!r} has no valid port (0-65535)")
    return host, int(port_text)


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def etcd_host_port(endpoint: str) -> str:
    """An etcd endpoint as ``ETCD_ENDPOINTS`` may spell it (``host:port``,
    ``[v6]:port`` or a bare host, meaning port 2379; an ``http://`` or ``https://``
    scheme is ignored, TLS is configured apart) as ``host:port``. Not validated:
    ``split_host_port`` does that."""
    endpoint = endpoint.strip()
    for scheme in _HTTP_SCHEMES:
        if endpoint.lower().startswith(scheme):
            endpoint = endpoint[len(scheme) :]
            break
    endpoint = endpoint.rstrip("/")
    if ":" not in endpoint.rpartition("]")[2]:
        endpoint += f":{DEFAULT_ETCD_PORT}"
    return endpoint
