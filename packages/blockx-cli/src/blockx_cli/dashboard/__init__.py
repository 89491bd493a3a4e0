"""``blockx dashboard``: a small read-only web view of a running cluster.

Pages, each with a JSON twin under ``/api/``: workers (the registry's
heartbeats), one worker (its DescribeWorker: executors and their calls, queues,
running tasks, recent failures, load over the last minutes), tasks (every
Worker's, by state, searchable by id, failures whose results expired marked), one
task (its phases, calls progress and failures), jobs (backfill and follow
progress, head lag, a link to their tasks) and placement (either cluster's
Coordinator's ExplainPlacement). ``sources`` and
``jobs_source`` read the cluster through ``blockx_client`` into the values of
``views``; ``app`` renders them (``templates/``, ``static/``); ``server`` serves
the app with uvicorn.

Nothing is imported here: Starlette, Jinja2 and uvicorn load only when the
dashboard starts, not with every ``blockx`` command.
"""
