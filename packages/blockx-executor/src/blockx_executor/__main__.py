"""``python -m blockx_executor``: run one executor process (started by a Worker)."""

from blockx_executor.process import main

main()
