"""Which cluster a task belongs to: the block cluster or the bundle cluster."""

from __future__ import annotations

from typing import Final

from blockx_client.models import Cluster, Task

_RETURN_VALUE_HANDLERS: Final = frozenset({"ReturnValueResultHandler", "ReturnValueHandler"})
_BY_BUILDER: Final = {
    "BlockTableCallConfig": Cluster.BLOCK,
    "BlockBundleCallConfig": Cluster.BUNDLE,
    "InputsCallConfig": Cluster.BUNDLE,
    "CallListCallConfig": Cluster.BLOCK,
}


def route(task: Task) -> Cluster:
    """A ReturnValue handler always means block (results come back to the caller);
    otherwise the builder decides; anything else goes to block."""
    handler = task.result_handler
    if handler is not None and handler.type in _RETURN_VALUE_HANDLERS:
        return Cluster.BLOCK
    return _BY_BUILDER.get(task.function_call_config.type, Cluster.BLOCK)
