"""TLS and credentials for BlockX's etcd connections.

aetcd 1.0.0 opens only insecure channels: ``aetcd.Client.connect`` calls
``grpc.aio.insecure_channel`` and, with a username, sends the password over it.
``SecureClient`` replaces that one method: it opens ``grpc.aio.secure_channel``
(the CA verifies etcd; a client certificate answers ``--client-cert-auth``) and
calls ``Auth/Authenticate`` over it. Every other aetcd call is unchanged: they
send ``self.metadata`` (the token) and use the stubs set here.

Tokens expire (etcd's ``--auth-token-ttl`` for simple tokens, the JWT's lifetime
otherwise). A call with an expired token fails with UNAUTHENTICATED, which aetcd
raises as ``UnauthenticatedError``, a ``ClientError``: the heartbeat publisher and
the registry watcher treat it like any other failure of the connection, close
this client and open a fresh one, which authenticates again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import aetcd
import aetcd.exceptions
import grpc
import grpc.aio
import msgspec
from aetcd import rpc, watcher

from blockx_core.errors import InvalidConfig
from blockx_server.runtime.env import ConfigReader
from blockx_server.runtime.settings import (
    ETCD_CA_FILE,
    ETCD_CERT_FILE,
    ETCD_KEY_FILE,
    ETCD_PASSWORD,
    ETCD_USERNAME,
    Setting,
)


class EtcdSecurity(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach etcd safely. All unset: plaintext and no authentication.

    ``ca_file`` turns TLS on and verifies etcd's certificate; ``cert_file`` and
    ``key_file`` present a client certificate; ``username`` and ``password``
    authenticate, and are only sent over TLS."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password: str | None = None

    @property
    def tls(self) -> bool:
        return self.ca_file is not None

    @property
    def plain(self) -> bool:
        """Neither TLS nor credentials: aetcd's own client serves."""
        return not self.tls and self.username is None

    def validate(self) -> None:
        """Raise ``InvalidConfig`` naming the first field that breaks a rule."""
        if self.password is not None and self.ca_file is None:
            raise InvalidConfig("password", "is only sent over TLS: set ETCD_CA_FILE too")
        if self.username is not None and self.password is None:
            raise InvalidConfig("password", "must be set when ETCD_USERNAME is")
        if self.password is not None and self.username is None:
            raise InvalidConfig("username", "must be set when ETCD_PASSWORD is")
        if self.cert_file is not None and self.key_file is None:
            raise InvalidConfig("key_file", "must be set when ETCD_CERT_FILE is")
        if self.key_file is not None and self.cert_file is None:
            raise InvalidConfig("cert_file", "must be set when ETCD_KEY_FILE is")
        if self.cert_file is not None and self.ca_file is None:
            raise InvalidConfig("ca_file", "must be set when ETCD_CERT_FILE is (TLS needs it)")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise InvalidConfig(name, f"is not a file ({path!r})")


# The setting behind each field, for reading and for configuration errors.
_SETTINGS: Final[Mapping[str, Setting[str | None]]] = {
    "ca_file": ETCD_CA_FILE,
    "cert_file": ETCD_CERT_FILE,
    "key_file": ETCD_KEY_FILE,
    "username": ETCD_USERNAME,
    "password": ETCD_PASSWORD,
}
SECURITY_ENV: Final[Mapping[str, str]] = {field: s.name for field, s in _SETTINGS.items()}


# aetcd ships no type hints: its classes are Any to mypy.
class EtcdAuthenticationFailed(aetcd.exceptions.ClientError):  # type: ignore[misc]
    """etcd refused the username and password (or authentication is not enabled)."""


def open_client(
    host: str,
    port: int,
    *,
    timeout_s: float,
    options: Mapping[str, Any],
    security: EtcdSecurity,
) -> aetcd.Client:
    """An unconnected client for one endpoint, secured as ``security`` says."""
    if security.plain:
        return aetcd.Client(host=host, port=port, timeout=timeout_s, options=dict(options))
    return SecureClient(host, port, timeout_s=timeout_s, options=options, security=security)


class SecureClient(aetcd.Client):  # type: ignore[misc]
    """``aetcd.Client`` over TLS, authenticating once per connection."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout_s: float,
        options: Mapping[str, Any],
        security: EtcdSecurity,
    ) -> None:
        # aetcd's own username/password stay unset: it would send them in plaintext.
        super().__init__(host=host, port=port, timeout=timeout_s, options=dict(options))
        self._security = security
        self._connect_lock = asyncio.Lock()

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        async with self._connect_lock:
            if self._connected.is_set():
                return
            channel = self._open_channel()
            try:
                metadata = await self._authenticate(channel)
            except BaseException:
                await channel.close()
                raise
            self.channel = channel
            self.metadata = metadata
            self.kvstub = rpc.KVStub(channel)
            self.clusterstub = rpc.ClusterStub(channel)
            self.leasestub = rpc.LeaseStub(channel)
            self.maintenancestub = rpc.MaintenanceStub(channel)
            self._watcher = watcher.Watcher(
                rpc.WatchStub(channel), timeout=self._timeout, metadata=metadata
            )
            self._connected.set()

    def _open_channel(self) -> grpc.aio.Channel:
        target = f"{self._host}:{self._port}"
        options = list(self._options.items())
        security = self._security
        if security.ca_file is None:
            return grpc.aio.insecure_channel(target, options=options)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(security.ca_file),
            private_key=_read(security.key_file),
            certificate_chain=_read(security.cert_file),
        )
        return grpc.aio.secure_channel(target, credentials, options=options)

    async def _authenticate(self, channel: grpc.aio.Channel) -> tuple[tuple[str, str], ...] | None:
        """The token metadata every call sends, or None without credentials."""
        security = self._security
        if security.username is None or security.password is None:
            return None
        request = rpc.AuthenticateRequest(name=security.username, password=security.password)
        try:
            reply = await rpc.AuthStub(channel).Authenticate(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise _authenticate_error(security.username, exc) from None
        return (("token", str(reply.token)),)


def _authenticate_error(username: str, exc: grpc.aio.AioRpcError) -> aetcd.exceptions.ClientError:
    detail = exc.details() or exc.code().name
    code = exc.code()
    if code is grpc.StatusCode.UNAVAILABLE:
        return aetcd.exceptions.ConnectionFailedError(detail)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return aetcd.exceptions.ConnectionTimeoutError(detail)
    return EtcdAuthenticationFailed(
        f"etcd refused user {username!r} (ETCD_USERNAME / ETCD_PASSWORD): {detail}"
    )


def _read(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


def read_etcd_security(reader: ConfigReader) -> EtcdSecurity:
    """The ETCD_* TLS and credential settings, each broken rule reported by name."""
    values = {field: reader.get(setting) for field, setting in _SETTINGS.items()}
    security = reader.validate(EtcdSecurity(**values), SECURITY_ENV, EtcdSecurity())
    # Half of a pair reset to its default would break another rule further on.
    return security if reader.valid(*SECURITY_ENV.values()) else EtcdSecurity()
