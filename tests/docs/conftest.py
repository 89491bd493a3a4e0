"""The docs test's tally: how many blocks of each document ran, were checked against
their output and were skipped, printed at the end of the run."""

from __future__ import annotations

import pytest

from docs.runner import TALLY_KEY


def pytest_configure(config: pytest.Config) -> None:
    config.stash[TALLY_KEY] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminalreporter.config.stash.get(TALLY_KEY, [])
    if lines:
        terminalreporter.section("doc blocks")
        for line in lines:
            terminalreporter.write_line(line)
