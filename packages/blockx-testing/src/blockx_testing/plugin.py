"""The pytest plugin of blockx-testing (entry point ``pytest11``: ``blockx``).

* ``blockx_replay``: a ``ReplayRunner`` (``run``, ``outcome``) whose calls run the
  project's functions directory unless they name one, on the session's executors.
* ``blockx_functions`` (ini): the functions directory of the project, relative to
  the ini file's directory.

Nothing starts until a test uses it: executors start at the first replay and stop
when the session ends.
"""

from __future__ import annotations

import pytest

from blockx_testing._runner import ReplayRunner, default_runner

FUNCTIONS_INI = "blockx_functions"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        FUNCTIONS_INI,
        "BlockX functions directory the blockx_replay fixture runs (relative to the ini file)",
        default="",
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    default_runner().executors.close()


@pytest.fixture(scope="session")
def blockx_replay(pytestconfig: pytest.Config) -> ReplayRunner:
    """Replays calls in real executors (started once per session), with the
    ``blockx_functions`` directory unless a call names one."""
    configured = str(pytestconfig.getini(FUNCTIONS_INI))
    functions = None
    if configured:
        base = pytestconfig.inipath.parent if pytestconfig.inipath else pytestconfig.rootpath
        functions = base / configured
    return ReplayRunner(default_runner().executors, functions=functions)
