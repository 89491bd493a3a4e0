"""The local cluster: ``blockx-dev``, ``blockx dev up`` and ``blockx demo``.

``launcher`` starts etcd and the BlockX processes, and ``chain`` anvil, the block
and sink databases and what feeds them; ``smoke`` and ``demo`` submit work to it
through ``blockx_client``; ``program`` is the ``blockx-dev`` command line;
``background`` runs it as a child process.
"""

from blockx_cli.devcluster.background import LocalCluster
from blockx_cli.devcluster.launcher import DevCluster, Endpoints, LaunchOptions

__all__ = ["DevCluster", "Endpoints", "LaunchOptions", "LocalCluster"]
