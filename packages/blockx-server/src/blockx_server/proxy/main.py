"""Console entry point: ``blockx-proxy``."""

from __future__ import annotations

from blockx_server.proxy.app import serve
from blockx_server.proxy.config import SETTINGS, load_proxy_config
from blockx_server.runtime.env import ConfigError
from blockx_server.runtime.event_loop import run_on
from blockx_server.runtime.process import fail, start_program

PROGRAM = "blockx-proxy"


def main() -> None:
    config = start_program(
        PROGRAM,
        "The proxy: one Unix socket in front of Coordinators, Workers and the Sync Invoker.",
        SETTINGS,
        load_proxy_config,
    )
    try:
        run_on(config.event_loop, serve(config))
    except ConfigError as exc:
        # The socket path was taken between validation and binding (e.g. a live proxy).
        fail(PROGRAM, f"invalid configuration: {exc}")
    except OSError as exc:
        fail(PROGRAM, f"cannot listen on {config.socket_path}: {exc}")
    except KeyboardInterrupt:
        pass
