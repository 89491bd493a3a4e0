"""The root options every command shares: where the deployment is.

The root callback of ``app.py`` stores them on the typer context; each command
reads them back with ``settings_of(ctx)``. Command modules import this module,
never ``app.py``, so the app can import every command module without a cycle.
"""

from __future__ import annotations

import typer

from blockx_client import Client


class Settings:
    def __init__(
        self,
        coordinator: str | None,
        bundle_coordinator: str | None,
        sync_invoker: str | None,
        proxy: str | None,
        etcd: str,
    ) -> None:
        self.coordinator = coordinator
        self.bundle_coordinator = bundle_coordinator
        self.sync_invoker = sync_invoker
        self.proxy = proxy
        self.etcd = etcd

    def client(self) -> Client:
        return Client(
            coordinator=self.coordinator,
            bundle_coordinator=self.bundle_coordinator,
            sync_invoker=self.sync_invoker,
            proxy_socket=self.proxy,
        )

    def etcd_endpoints(self) -> list[str]:
        return [e.strip() for e in self.etcd.split(",") if e.strip()]


def settings_of(ctx: typer.Context) -> Settings:
    settings = ctx.obj
    assert isinstance(settings, Settings)
    return settings
