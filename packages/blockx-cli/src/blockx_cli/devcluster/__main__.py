"""``python -m blockx_cli.devcluster``: the same program as ``blockx-dev``."""

from blockx_cli.devcluster.program import main

main()
