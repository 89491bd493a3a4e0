"""Where a Client's calls go and how long they may take, shared by its parts."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from blockx_client.backoff import RetryPolicy
from blockx_client.dev_config import LayeredEnviron
from blockx_client.errors import InvalidRequestError

# The addresses a Client dials when it does not go through a proxy.
ADDRESS_VARIABLES: Final = (
    "BLOCKX_COORDINATOR",
    "BLOCKX_BUNDLE_COORDINATOR",
    "BLOCKX_SYNC_INVOKER",
)


def client_environ() -> LayeredEnviron:
    """Where a Client's unset arguments come from: the environment, then the running
    ``blockx dev up``'s ``dev.toml`` (``blockx_client.dev_config``)."""
    return LayeredEnviron()


def proxy_socket_of(
    env: LayeredEnviron,
    proxy_socket: str | None,
    *,
    direct: bool,
    addresses: Sequence[str | None],
) -> str | None:
    """The proxy's Unix socket every RPC goes through; None: dial each address.

    The first of: ``direct`` (no proxy); the ``proxy_socket`` argument;
    PROXY_SOCKET_PATH in the environment; the running ``dev up``'s proxy
    (``dev.toml``), as the specification's client sends every RPC through the
    proxy. That last one is not used when ``addresses`` or the environment name a
    coordinator or Sync Invoker: the dev cluster's proxy forwards only to its own
    cluster, and a client told to reach another one must not land there."""
    if direct:
        if proxy_socket:
            raise InvalidRequestError(
                f"proxy_socket={proxy_socket!r} and direct=True contradict each other"
            )
        return None
    if proxy_socket:
        return proxy_socket
    found = env.get("PROXY_SOCKET_PATH", "").strip()
    if not found or not env.from_file("PROXY_SOCKET_PATH"):
        return found or None
    named = any(addresses) or any(
        env.get(name, "").strip() and not env.from_file(name) for name in ADDRESS_VARIABLES
    )
    return None if named else found


@dataclass(slots=True, kw_only=True)
class ClientOptions:
    """Mutable on purpose: ``client.retry = ...`` takes effect on the next call."""

    coordinator: str
    bundle_coordinator: str | None
    sync_invoker: str
    retry: RetryPolicy
    rpc_timeout_s: float


@dataclass(frozen=True, kw_only=True)
class GrpcTls:
    """TLS to the BlockX servers, the ``GRPC_TLS_*`` files the servers read.

    ``ca_file`` verifies each server's certificate (and the address dialled);
    ``cert_file`` and ``key_file`` present a client certificate, which servers
    with a CA file require. All unset: plaintext. Calls through the proxy's Unix
    socket are never TLS (the proxy holds the upstream TLS)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise InvalidRequestError(
                "GRPC_TLS_CERT_FILE and GRPC_TLS_KEY_FILE must be set together"
            )

    @property
    def enabled(self) -> bool:
        return self.ca_file is not None or self.cert_file is not None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> GrpcTls:
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            return env.get(name, "").strip() or None

        return cls(
            ca_file=get("GRPC_TLS_CA_FILE"),
            cert_file=get("GRPC_TLS_CERT_FILE"),
            key_file=get("GRPC_TLS_KEY_FILE"),
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context every channel uses; None: plaintext."""
        if not self.enabled:
            return None
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
            if self.cert_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidRequestError(f"cannot load the GRPC_TLS_* files: {exc}") from None
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # grpc is HTTP/2 only: servers refuse a TLS client that offers no h2.
        context.set_alpn_protocols(["h2"])
        return context
