"""The pytest plugin of blockx-testing (entry point ``pytest11``: ``blockx``).

* ``blockx_replay``: the session's ``ReplayRunner`` bound to the ini option
  ``blockx_functions``: ``blockx_replay.run("token_volume", args,
  fixture=...)`` runs with that functions directory unless the call names one.
* ``blockx_functions`` (ini): the functions directory of the project, relative to
  the ini file's directory.

Nothing starts until a test uses it: executors start at the first replay and stop
when the session ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from blockx_core.call_record import CallRecord
from blockx_server.calls.replay import ReplayOutcome
from blockx_testing._runner import ReplayRunner, default_runner

FUNCTIONS_INI = "blockx_functions"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        FUNCTIONS_INI,
        "BlockX functions directory the blockx_replay fixture runs (relative to the ini file)",
        default="",
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    default_runner().close()


class BlockxReplay:
    """What the ``blockx_replay`` fixture gives a test: ``run`` (the value, or
    CallFailed) and ``outcome`` (ReplayReturned or ReplayFailed), with the
    project's functions directory unless one is named."""

    def __init__(self, runner: ReplayRunner, functions: Path | None) -> None:
        self.runner = runner
        self.functions = functions

    def run(
        self,
        function: str | None = None,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        fixture: str | Path | CallRecord | None = None,
        functions: str | Path | None = None,
        budget_ms: int | None = None,
    ) -> Any:
        return self.runner.run(
            function,
            args,
            kwargs,
            fixture=fixture,
            functions=functions or self.functions,
            budget_ms=budget_ms,
        )

    def outcome(
        self,
        function: str | None = None,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        fixture: str | Path | CallRecord | None = None,
        functions: str | Path | None = None,
        budget_ms: int | None = None,
    ) -> ReplayOutcome:
        return self.runner.outcome(
            function,
            args,
            kwargs,
            fixture=fixture,
            functions=functions or self.functions,
            budget_ms=budget_ms,
        )


@pytest.fixture(scope="session")
def blockx_replay(pytestconfig: pytest.Config) -> BlockxReplay:
    """Replays calls in real executors (started once per session)."""
    configured = str(pytestconfig.getini(FUNCTIONS_INI))
    functions = None
    if configured:
        base = pytestconfig.inipath.parent if pytestconfig.inipath else pytestconfig.rootpath
        functions = base / configured
    return BlockxReplay(default_runner(), functions)
