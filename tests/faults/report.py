"""The faults x invariants table: one row per fault run, printed at the end of the
session (``pytest_terminal_summary`` in this directory's conftest) and written to
``faults-table.txt`` in pytest's base temporary directory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

INVARIANTS: Final = ("known", "one commit", "slots freed", "retained", "routes again")


@dataclass
class FaultRow:
    fault: str
    network: str
    tasks: int = 0
    lost: int = 0
    doubled: int = 0
    # invariant -> held; an invariant not checked (the run stopped early) is absent.
    held: dict[str, bool] = field(default_factory=dict)
    # What was seen when an invariant did not hold, for the failure message.
    violations: list[str] = field(default_factory=list)
    # What was observed beyond the invariants (e.g. watchers that met a compaction).
    notes: list[str] = field(default_factory=list)

    def check(self, invariant: str, held: bool, violation: str) -> None:
        assert invariant in INVARIANTS, invariant
        self.held[invariant] = self.held.get(invariant, True) and held
        if not held:
            self.violations.append(f"{invariant}: {violation}")


@dataclass
class FaultReport:
    rows: list[FaultRow] = field(default_factory=list)
    path: str = ""  # where the table was written, once it was

    def render(self) -> str:
        head = ["fault", "network", "tasks", "lost", "doubled", *INVARIANTS]
        body = [
            [
                row.fault,
                row.network,
                str(row.tasks),
                str(row.lost),
                str(row.doubled),
                *(_mark(row.held.get(name)) for name in INVARIANTS),
            ]
            for row in self.rows
        ]
        widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]

        def fmt(line: list[str]) -> str:
            return "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))

        rule = "  ".join("-" * width for width in widths)
        return "\n".join([fmt(head), rule, *(fmt(line) for line in body)])


def _mark(held: bool | None) -> str:
    return "-" if held is None else ("✓" if held else "✗")


# The session's report: the suite appends, the conftest prints and writes it.
REPORT: Final = FaultReport()
