"""Console entry point: ``blockx-syncinvoker``.

The whole configuration is validated before anything is logged; bad values, an
unreadable FUNCTIONS_DIR or memory seed, or a port in use end the process with
one line per problem on stderr and exit code 2. SIGINT/SIGTERM stop it cleanly
(exit 0).
"""

from __future__ import annotations

from blockx_server.calls.functions import FunctionStoreError
from blockx_server.io.chain_config import CHAINS_TABLE
from blockx_server.runtime.event_loop import run_on
from blockx_server.runtime.process import StartupError, fail, start_program
from blockx_server.runtime.serving import ListenError
from blockx_server.syncinvoker.app import serve
from blockx_server.syncinvoker.config import PROGRAM, SETTINGS, load_syncinvoker_config


def main() -> None:
    config = start_program(
        PROGRAM,
        "The Sync Invoker: runs one function call per request on Python executors.",
        SETTINGS,
        load_syncinvoker_config,
        tables=(CHAINS_TABLE,),
    )
    try:
        run_on(config.event_loop, serve(config))
    except FunctionStoreError as exc:
        fail(PROGRAM, f"cannot load functions: {exc}")
    except ListenError as exc:
        fail(PROGRAM, str(exc))
    except StartupError as exc:
        fail(PROGRAM, f"cannot start: {exc}")
    except OSError as exc:
        fail(PROGRAM, f"stopped: {exc}")
    except KeyboardInterrupt:
        pass
