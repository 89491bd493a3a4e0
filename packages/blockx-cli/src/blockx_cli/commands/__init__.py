"""The ``blockx`` commands, one module per noun.

Each module holds a ``typer.Typer`` whose commands ``app.py`` merges into the root
app: ``task`` (reserve, submit, watch, get-result), ``function`` (invoke,
precheck), ``workers``, ``why`` (placement explanations), ``dev`` (dev up, demo)
and ``version`` (version-info).
A command declares its options, then runs its coroutine through ``runner.run``.
"""
