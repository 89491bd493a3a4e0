"""``blockx dashboard``: a small read-only web view of a running cluster.

Pages, each with a JSON twin under ``/api/``: workers (the registry's
heartbeats), tasks (every Worker's, by state, searchable by id), one task (its
phases, calls progress and failures), jobs (backfill and follow progress, head
lag) and placement (either cluster's Coordinator's ExplainPlacement). ``sources`` and
``jobs_source`` read the cluster through ``blockx_client`` into the values of
``views``; ``app`` renders them (``templates/``, ``static/``); ``server`` serves
the app with uvicorn.

Nothing is imported here: Starlette, Jinja2 and uvicorn load only when the
dashboard starts, not with every ``blockx`` command.
"""
