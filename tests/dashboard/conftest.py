"""Where the dashboard tests keep their screenshots, and a line saying so at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest

ARTIFACTS: Final = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
_used: list[Path] = []


@pytest.fixture(scope="module")
def artifacts() -> Path:
    """``test-artifacts/dashboard/`` at the repository root (not committed)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    _used.append(ARTIFACTS)
    return ARTIFACTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _used:
        shots = sorted(p.name for p in ARTIFACTS.glob("*.png"))
        terminalreporter.write_line(f"dashboard screenshots in {ARTIFACTS}: {', '.join(shots)}")
