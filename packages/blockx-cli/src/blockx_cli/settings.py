"""The root options every command shares: where the deployment is.

The root callback of ``app.py`` stores them on the typer context; each command
reads them back with ``settings_of(ctx)``. Command modules import this module,
never ``app.py``, so the app can import every command module without a cycle.

Where an address is not given by a flag or its environment variable, it comes from
the running ``blockx dev up`` (``blockx_client.dev_config``), then the default.
"""

from __future__ import annotations

import os

import typer

from blockx_client import Client, EtcdAccess
from blockx_client.dev_config import read_dev_config

DEFAULT_ETCD = "localhost:2379"


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
    ) -> None:
        self.coordinator = coordinator
        self.bundle_coordinator = bundle_coordinator
        self.sync_invoker = sync_invoker
        # --direct: dial each address, through no proxy (not even --proxy's).
        self.proxy = None if direct else proxy
        self.direct = direct
        self._etcd = etcd
        self.etcd_files = etcd_files
        self.etcd_username = etcd_username

    def client(self) -> Client:
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
        return self._named_etcd() or DEFAULT_ETCD

    def _named_etcd(self) -> str | None:
        """The flag or ETCD_ENDPOINTS, else the running ``dev up``'s etcd."""
        return self._etcd or read_dev_config().get("ETCD_ENDPOINTS") or None

    def etcd_endpoints(self) -> list[str]:
        return [e.strip() for e in self.etcd.split(",") if e.strip()]


def settings_of(ctx: typer.Context) -> Settings:
    settings = ctx.obj
    assert isinstance(settings, Settings)
    return settings
