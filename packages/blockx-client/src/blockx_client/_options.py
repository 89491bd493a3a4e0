"""Where a Client's calls go and how long they may take, shared by its parts."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

from blockx_client.backoff import RetryPolicy
from blockx_client.dev_config import LayeredEnviron
from blockx_client.errors import InvalidRequestError


def client_environ() -> Mapping[str, str]:
    """Where a Client's unset arguments come from: the environment, then the running
    ``blockx dev up``'s ``dev.toml`` (``blockx_client.dev_config``)."""
    return LayeredEnviron()


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
