"""The root options every command shares: where the deployment is.

The root callback of ``app.py`` stores them on the typer context; each command
reads them back with ``settings_of(ctx)``. Command modules import this module,
never ``app.py``, so the app can import every command module without a cycle.

Where an address is not given by a flag or its environment variable, it comes from
the running ``blockx dev up`` (``blockx_client.dev_config``), then the default.
Each remembers which of those gave it, for the errors about reaching it.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from contextvars import ContextVar
from typing import TYPE_CHECKING, Final

import typer

if TYPE_CHECKING:
    # The root callback makes a Settings for every command, ``--help`` included: the
    # cluster's client is imported by the methods that use it.
    from blockx_client import Client, EtcdAccess
    from blockx_client.setting import Setting

DEFAULT_ETCD = "localhost:2379"

# The root options that name an address, by the variable each one reads.
FLAGS: Final = {
    "BLOCKX_COORDINATOR": "--coordinator",
    "BLOCKX_BUNDLE_COORDINATOR": "--bundle-coordinator",
    "BLOCKX_SYNC_INVOKER": "--sync-invoker",
    "PROXY_SOCKET_PATH": "--proxy",
    "ETCD_ENDPOINTS": "--etcd",
}


class Settings:
    def __init__(
        self,
        coordinator: str | None,
        bundle_coordinator: str | None,
        sync_invoker: str | None,
        proxy: str | None,
        etcd: str | None,
        *,
        etcd_files: tuple[str | None, str | None, str | None] = (None, None, None),
        etcd_username: str | None = None,
        direct: bool = False,
        from_environment: Collection[str] = (),
    ) -> None:
        """``from_environment``: the variables (of FLAGS) whose value typer read from
        the environment rather than from the flag."""
        self.coordinator = coordinator
        self.bundle_coordinator = bundle_coordinator
        self.sync_invoker = sync_invoker
        # --direct: dial each address, through no proxy (not even --proxy's).
        self.proxy = None if direct else proxy
        self.direct = direct
        self.etcd_files = etcd_files
        self.etcd_username = etcd_username
        given = (coordinator, bundle_coordinator, sync_invoker, self.proxy, etcd)
        self._given = {v: value for v, value in zip(FLAGS, given, strict=True) if value}
        self._from_environment = frozenset(from_environment)

    def client(self) -> Client:
        from blockx_client import Client

        return Client(
            coordinator=self.coordinator,
            bundle_coordinator=self.bundle_coordinator,
            sync_invoker=self.sync_invoker,
            proxy_socket=self.proxy,
            direct=self.direct,
        )

    def etcd_access(self) -> EtcdAccess:
        """TLS and credentials for etcd; the password only ever comes from ETCD_PASSWORD
        (a command line is visible to every user of the host)."""
        from blockx_client import EtcdAccess

        ca_file, cert_file, key_file = self.etcd_files
        return EtcdAccess(
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
            username=self.etcd_username,
            password=os.environ.get("ETCD_PASSWORD") or None,
        )

    @property
    def etcd(self) -> str:
        """The flag or ETCD_ENDPOINTS, else the running ``dev up``'s etcd, else the default.

        Read when a command needs it, so a bad dev.toml fails that command alone."""
        return self.etcd_setting().value or DEFAULT_ETCD

    def etcd_setting(self) -> Setting:
        """The etcd endpoints and where they came from."""
        from blockx_client.dev_config import LayeredEnviron

        given = self.given_setting("ETCD_ENDPOINTS")
        return given or LayeredEnviron().setting("ETCD_ENDPOINTS", default=DEFAULT_ETCD)

    def given_setting(self, variable: str) -> Setting | None:
        """``variable`` (one of FLAGS) as this command was given it, by its flag or
        from the environment; None when neither named it."""
        from blockx_client import InvalidRequestError
        from blockx_client.dev_config import LayeredEnviron
        from blockx_client.setting import Origin

        value = self._given.get(variable)
        if value is None:
            return None
        try:
            env = LayeredEnviron()
        except InvalidRequestError:  # a dev.toml that is no TOML has nothing to compare
            env = LayeredEnviron(dev={})
        origin = Origin.ENVIRONMENT if variable in self._from_environment else Origin.GIVEN
        return env.setting(variable, value, given_origin=origin)

    def etcd_endpoints(self) -> list[str]:
        return [e.strip() for e in self.etcd.split(",") if e.strip()]


def settings_of(ctx: typer.Context) -> Settings:
    settings = ctx.obj
    assert isinstance(settings, Settings)
    return settings


# The running command's settings, for what reports its errors (``runner``); None
# outside a command.
CURRENT: ContextVar[Settings | None] = ContextVar("blockx_cli_settings", default=None)
