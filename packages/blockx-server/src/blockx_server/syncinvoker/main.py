"""Console entry point: ``blockx-syncinvoker``.

The whole configuration is validated before anything is logged; a bad value, an
unreadable FUNCTIONS_DIR or memory seed, or a port in use ends the process with
one line on stderr and exit code 2. SIGINT/SIGTERM stop it cleanly (exit 0).
"""

from __future__ import annotations

import asyncio
import os

from blockx_server.calls.functions import FunctionStoreError
from blockx_server.runtime.env import ConfigError
from blockx_server.runtime.process import StartupError, configure_logging, fail
from blockx_server.syncinvoker.app import serve
from blockx_server.syncinvoker.config import PROGRAM, load_syncinvoker_config


def main() -> None:
    try:
        config = load_syncinvoker_config(os.environ)
    except ConfigError as exc:
        fail(PROGRAM, f"invalid configuration: {exc}")
    configure_logging(config.log_level)
    try:
        asyncio.run(serve(config))
    except FunctionStoreError as exc:
        fail(PROGRAM, f"cannot load functions: {exc}")
    except StartupError as exc:
        fail(PROGRAM, f"cannot start: {exc}")
    except OSError as exc:
        where = f"{config.listen_host or '0.0.0.0'}:{config.listen_port}"
        fail(PROGRAM, f"cannot serve on {where}: {exc}")
    except KeyboardInterrupt:
        pass
