"""Console entry point: ``blockx-proxy``."""

from __future__ import annotations

import asyncio
import os

from blockx_server.proxy.app import serve
from blockx_server.proxy.config import load_proxy_config
from blockx_server.runtime.env import ConfigError
from blockx_server.runtime.process import configure_logging, fail

PROGRAM = "blockx-proxy"


def main() -> None:
    # Validate everything before anything is logged.
    try:
        config = load_proxy_config(os.environ)
    except ConfigError as exc:
        fail(PROGRAM, f"invalid configuration: {exc}")
    configure_logging(config.log_level)
    try:
        asyncio.run(serve(config))
    except ConfigError as exc:
        # The socket path was taken between validation and binding (e.g. a live proxy).
        fail(PROGRAM, f"invalid configuration: {exc}")
    except OSError as exc:
        fail(PROGRAM, f"cannot listen on {config.socket_path}: {exc}")
    except KeyboardInterrupt:
        pass
