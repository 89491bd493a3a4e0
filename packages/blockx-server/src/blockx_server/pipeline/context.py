"""What a task's Builder and Writer Plugin see of it (the specification's TaskCtx)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from blockx_core.chains import Chain
from blockx_core.code_view import CodeSnapshot
from blockx_core.task import TaskInput
from blockx_server.io.scope import TaskIoScope

# Blocks per bundle of a BlockBundleCallConfig and of the writer of its bundles,
# when neither names ``bundleSize``.
DEFAULT_BUNDLE_SIZE: Final = 100


@dataclass(slots=True)
class ChainScan:
    """What a chain Builder scanned, for the task's Writer Plugin: the source
    ``table``, every block of the range with the hash it read (blocks without a
    matching row included, so a writer can tell "no rows" from "not covered"), and
    the ``bundle_size`` of a BlockBundleCallConfig (None for other builders).
    Empty until a chain Builder records it."""

    table: str | None = None
    block_hashes: dict[int, str] = field(default_factory=dict)
    bundle_size: int | None = None
    # The bundles a streamed task's bundle writer committed during its Calls phase,
    # each ``[first block, last block, blocks, rows]``; their blocks have left
    # ``block_hashes``.
    committed: list[list[int]] = field(default_factory=list)

    def record(self, table: str, block_hashes: dict[int, str], bundle_size: int | None) -> None:
        self.table = table
        self.block_hashes = block_hashes
        self.bundle_size = bundle_size


@dataclass(frozen=True, slots=True)
class TaskContext:
    task: TaskInput
    # Unix ms by which the task must converge.
    deadline_ms: int
    # The Function Code View epoch pinned at activation.
    code: CodeSnapshot
    io: TaskIoScope
    # Filled by BlockTableCallConfig / BlockBundleCallConfig in the Builder phase.
    scan: ChainScan = field(default_factory=ChainScan)
    # The chain the task reads (its Builder config's "chain"); None when the
    # process serves no chain.
    chain: Chain | None = None

    @property
    def task_id(self) -> str:
        return self.task.task_id
