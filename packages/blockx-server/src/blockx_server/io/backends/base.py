"""What an IO backend is: ``io.<name>.<op>(*args, **kwargs)`` reaches its ``serve``.

A backend is one module in this folder and a line in ``open_router``
(``blockx_server.io.config``); the router (``blockx_server.io.router``) and a
chain's backends (``blockx_server.io.chain_io``) hold them by name.
"""

from __future__ import annotations

from typing import Any, Protocol


class IoBackend(Protocol):
    """One backend: ``io.<name>.<op>(*args, **kwargs)`` reaches ``serve(op, args, kwargs)``.

    ``serve`` raises BackendError (``blockx_server.io.errors``) for a failure a
    function should see, and TypeError or ValueError for arguments it cannot use
    (BAD_REQUEST). ``immutable`` says whether the answer to a read can never change
    (for chain data: it names a block at or below ``finalized``, the finalized
    height, None while unknown); only those answers are cached.
    """

    name: str
    read_ops: frozenset[str]
    write_ops: frozenset[str]

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any: ...

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool: ...
