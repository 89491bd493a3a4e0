"""The chain a task reads: its Builder config's ``"chain"``, checked against the
chains the process serves.

Every Worker of a cluster serves the same chains (a deployment rule: placement does
not look at chains), so a chain this Worker does not serve, or no chain named where
several are served, fails the task at activation, not retryable, naming the chains
served. No chain named where one is served: that one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from blockx_core.chains import Chain

_decode = msgspec.json.Decoder().decode


class ChainRefused(Exception):
    """The task cannot be served here; ``str()`` is the one line it fails with."""


def named_chain(config_json: str) -> str | None:
    """The ``"chain"`` a Builder config names; None when it names none (or is no
    JSON object: its Builder says what is wrong with it)."""
    if '"chain"' not in config_json:
        return None  # a long call list is not decoded on the loop to learn nothing
    try:
        config: Any = _decode(config_json or "{}")
    except msgspec.DecodeError:
        return None
    if not isinstance(config, dict):
        return None
    name = config.get("chain")
    if name is not None and not isinstance(name, str):
        raise ChainRefused(f"the Builder config's \"chain\" is a chain's name (got {name!r})")
    return name


def task_chain(config_json: str, served: Sequence[Chain]) -> Chain | None:
    """The chain the task reads, None when the process serves none and the task
    names none; ChainRefused otherwise."""
    name = named_chain(config_json)
    names = ", ".join(sorted(chain.name for chain in served)) or "none"
    if name is None:
        if len(served) <= 1:
            return served[0] if served else None
        raise ChainRefused(
            f"this Worker serves several chains ({names}): the task's Builder config must "
            'name one ("chain": NAME)'
        )
    for chain in served:
        if chain.name == name:
            return chain
    raise ChainRefused(f"this Worker does not serve chain {name!r} (it serves: {names})")
