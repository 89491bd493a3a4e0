"""``python -m blockx_cli``: the ``blockx`` command line."""

from blockx_cli.launch import main

main()
