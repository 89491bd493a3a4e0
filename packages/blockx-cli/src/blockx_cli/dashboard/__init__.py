"""``blockx dashboard``: a small read-only web view of a running cluster.

Pages, each with a JSON twin under ``/api/``: workers (the registry's
heartbeats), tasks (every Worker's, by state, searchable by id), one task (its
phases, calls progress and failures), jobs (backfill and follow progress, head
lag) and placement (the block Coordinator's ExplainPlacement). ``sources`` and
``jobs_source`` read the cluster through ``blockx_client`` into the values of
``views``; ``app`` renders them (``templates/``, ``static/``); ``server`` serves
the app with uvicorn.
"""

from blockx_cli.dashboard.app import create_app
from blockx_cli.dashboard.config import DEFAULT_HOST, DEFAULT_PORT, DashboardConfig
from blockx_cli.dashboard.server import BindError, serve

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "BindError", "DashboardConfig", "create_app", "serve"]
