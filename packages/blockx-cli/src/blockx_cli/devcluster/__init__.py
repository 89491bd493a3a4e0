"""The local cluster: ``blockx-dev``, ``blockx dev up`` and ``blockx demo``.

``launcher`` starts etcd and the BlockX processes, and ``chain`` anvil, the block
and sink databases and what feeds them; ``smoke`` and ``demo`` submit work to it
through ``blockx_client``; ``program`` is the ``blockx-dev`` command line;
``background`` runs it as a child process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blockx_cli.devcluster.background import LocalCluster

if TYPE_CHECKING:
    from blockx_cli.devcluster.launcher import DevCluster, Endpoints, LaunchOptions

# The launcher's names load on first use: a program driving a cluster in the
# background (``blockx demo``, the tests) does not load what starts one.
_LAUNCHER_NAMES = frozenset({"DevCluster", "Endpoints", "LaunchOptions"})


def __getattr__(name: str) -> object:
    if name in _LAUNCHER_NAMES:
        from blockx_cli.devcluster import launcher

        return getattr(launcher, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DevCluster", "Endpoints", "LaunchOptions", "LocalCluster"]
