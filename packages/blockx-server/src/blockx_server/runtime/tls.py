"""TLS and mutual TLS for BlockX's gRPC servers and the channels between them.

One set of files per process (``GRPC_TLS_CERT_FILE``, ``GRPC_TLS_KEY_FILE``,
``GRPC_TLS_CA_FILE``) serves both directions:

* a server with a certificate and key speaks TLS only; with a CA file as well it
  requires every client to present a certificate that CA signed (mTLS);
* a client with a CA file verifies the server's certificate against that CA (and
  the address it dials: certificates must name the host or IP of
  ``WORKER_ADVERTISE_ADDR`` and the other listen addresses); with a certificate
  and key it presents them as its client certificate.

So with mTLS an address that does not hold a certificate of the cluster's CA
fails the handshake: a forged registry entry cannot take tasks, and a client
without a certificate cannot call a Worker.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import msgspec

from blockx_core.errors import InvalidConfig
from blockx_server.runtime.env import ConfigReader
from blockx_server.runtime.settings import (
    GRPC_TLS_CA_FILE,
    GRPC_TLS_CERT_FILE,
    GRPC_TLS_KEY_FILE,
    Setting,
)

# grpc is HTTP/2 only; grpc-go and grpc core refuse a TLS peer that negotiates no ALPN.
_ALPN: Final = ["h2"]


class GrpcTls(msgspec.Struct, frozen=True, kw_only=True):
    """A process's gRPC TLS files; all unset means plaintext both ways."""

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None

    @property
    def client_enabled(self) -> bool:
        return self.ca_file is not None or self.cert_file is not None

    def validate(self) -> None:
        """Raise ``InvalidConfig`` naming the first field that breaks a rule."""
        if self.cert_file is not None and self.key_file is None:
            raise InvalidConfig("key_file", "must be set when GRPC_TLS_CERT_FILE is")
        if self.key_file is not None and self.cert_file is None:
            raise InvalidConfig("cert_file", "must be set when GRPC_TLS_KEY_FILE is")
        for name in ("cert_file", "key_file", "ca_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise InvalidConfig(name, f"is not a file ({path!r})")

    def validate_server(self) -> None:
        """``validate`` plus the rule of a process that serves: a CA alone cannot
        serve TLS, and silently serving plaintext would be worse."""
        GrpcTls.validate(self)
        if self.ca_file is not None and self.cert_file is None:
            raise InvalidConfig(
                "cert_file", "must be set when GRPC_TLS_CA_FILE is (the server's certificate)"
            )

    def server_context(self) -> ssl.SSLContext | None:
        """The context ``Server.start(ssl=...)`` takes; None: plaintext."""
        if self.cert_file is None or self.key_file is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.ca_file is not None:
            context.load_verify_locations(cafile=self.ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        context.set_alpn_protocols(_ALPN)
        return context

    def client_context(self) -> ssl.SSLContext | None:
        """The context ``Channel(ssl=...)`` takes; None: plaintext. Without a CA
        file the system's trusted CAs verify the server."""
        if not self.client_enabled:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file)
        context.set_alpn_protocols(_ALPN)
        return context


_SETTINGS: Final[Mapping[str, Setting[str | None]]] = {
    "cert_file": GRPC_TLS_CERT_FILE,
    "key_file": GRPC_TLS_KEY_FILE,
    "ca_file": GRPC_TLS_CA_FILE,
}
_ENV: Final[Mapping[str, str]] = {field: s.name for field, s in _SETTINGS.items()}


def read_grpc_tls(reader: ConfigReader, *, serves: bool) -> GrpcTls:
    """The GRPC_TLS_* settings; ``serves``: the process runs a gRPC server."""
    values = {field: reader.get(setting) for field, setting in _SETTINGS.items()}
    tls = GrpcTls(**values)
    if serves:
        # reader.validate wants a ``validate`` method: check the server's rules too.
        tls = reader.validate(_ServerTls(**values), _ENV, _ServerTls()).as_tls()
    else:
        tls = reader.validate(tls, _ENV, GrpcTls())
    # Half of a pair reset to its default would break another rule further on.
    if not reader.valid(*_ENV.values()):
        return GrpcTls()
    try:
        # Load the files now: a bad PEM is a configuration error, not a traceback later.
        tls.server_context() if serves else None
        tls.client_context()
    except (ssl.SSLError, OSError, ValueError) as exc:
        reader.report(
            GRPC_TLS_CERT_FILE.name if tls.cert_file is not None else GRPC_TLS_CA_FILE.name,
            f"cannot be loaded (with the other GRPC_TLS_* files): {exc}",
        )
        return GrpcTls()
    return tls


class _ServerTls(GrpcTls, frozen=True, kw_only=True):
    def validate(self) -> None:
        self.validate_server()

    def as_tls(self) -> GrpcTls:
        return GrpcTls(cert_file=self.cert_file, key_file=self.key_file, ca_file=self.ca_file)
