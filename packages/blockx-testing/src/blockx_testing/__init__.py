"""blockx_testing: unit-test BlockX functions offline.

``run_function("token_volume", args, fixture="fixtures/block_123.json")`` runs the
function in a real executor process with the sandbox a Worker gives it, every IO
request answered from the fixture (a call record: ``blockx invoke --record``,
``blockx replay``), and returns its value or raises ``CallFailed`` as the call
fails. The pytest plugin (loaded by installing this package) adds the
``blockx_replay`` fixture and the ``blockx_functions`` ini option.
"""

from blockx_server.calls.replay import ReplayFailed, ReplayRefused, ReplayReturned
from blockx_testing._runner import (
    CallFailed,
    Executors,
    ReplayOptions,
    ReplayRunner,
    default_runner,
    load_fixture,
    run_function,
)

__all__ = [
    "CallFailed",
    "Executors",
    "ReplayFailed",
    "ReplayOptions",
    "ReplayRefused",
    "ReplayReturned",
    "ReplayRunner",
    "default_runner",
    "load_fixture",
    "run_function",
]
