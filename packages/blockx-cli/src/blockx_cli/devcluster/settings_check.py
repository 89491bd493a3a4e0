"""The settings of every BlockX process the local cluster starts, checked before it
starts any.

Each child reads its configuration from the environment it is started with: the
shell's variables (less the cluster's own, ``DEV_VARIABLES``) plus what the
launcher sets. A bad value in the shell (``BLOCKX_LOG_FORMAT=yaml``) would stop
every child at its start-up, after etcd and anvil had started and the children had
loaded their code. So the launcher reads each child's environment first with the
loader that child's ``start_program`` runs (``configuration_errors``): what it
refuses here is what the child would refuse, and nothing has started yet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Final

from blockx_server.coordinator.config import BLOCK_PROFILE, BUNDLE_PROFILE, load_coordinator_config
from blockx_server.proxy.config import load_proxy_config
from blockx_server.runtime.env import Environ
from blockx_server.runtime.process import configuration_errors
from blockx_server.syncinvoker.config import load_syncinvoker_config
from blockx_server.worker.config import BLOCK_WORKER, BUNDLE_WORKER, load_worker_config

# Each server program and the loader its entry point (``blockx_server.*.main``)
# hands to ``start_program``. A program not listed here (the dashboard, which the
# launcher gives every setting as a flag) is not checked.
LOADERS: Final[Mapping[str, Callable[[Environ], object]]] = {
    "blockx-coordinator": partial(load_coordinator_config, BLOCK_PROFILE),
    "blockx-bundle-coordinator": partial(load_coordinator_config, BUNDLE_PROFILE),
    "blockx-worker": partial(load_worker_config, BLOCK_WORKER),
    "blockx-bundle-worker": partial(load_worker_config, BUNDLE_WORKER),
    "blockx-syncinvoker": load_syncinvoker_config,
    "blockx-proxy": load_proxy_config,
}


def settings_problems(children: Sequence[tuple[str, Environ]]) -> list[str]:
    """One line per bad setting among ``children`` (program, environment), as the
    programs say it, with the programs that would refuse it; empty when all would
    start. A variable every checked child refuses (a shell's bad
    ``BLOCKX_LOG_FORMAT``) is one line, not one per child."""
    refused: dict[str, list[str]] = {}
    checked = [program for program, _ in children if program in LOADERS]
    for program, environ in children:
        load = LOADERS.get(program)
        if load is None:
            continue
        for error in configuration_errors(load, environ):
            refused.setdefault(str(error), []).append(program)
    return [
        f"invalid configuration: {error} "
        f"(read by {'every server' if programs == checked else ', '.join(programs)})"
        for error, programs in refused.items()
    ]
