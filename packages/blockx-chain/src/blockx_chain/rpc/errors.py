"""What a JSON-RPC request can fail with, classified the way a caller must react.

* ``UNAVAILABLE``: the node could not answer now (HTTP 429 or 5xx, a refused or
  broken connection, a timeout, a node-side rate limit or internal error); a retry
  may succeed.
* ``BAD_REQUEST``: the request itself is wrong (bad parameters, an unknown method,
  a reverted call, an answer larger than the client accepts); a retry fails the same.
* ``NOT_FOUND``: the node does not know the block or transaction asked for, where an
  answer is required.
* ``BAD_ANSWER``: the node answered, but not what was asked for (another block, the
  receipt of another transaction) or not in JSON-RPC's shapes (a quantity that is
  not hex, a string where an object belongs); see ``blockx_chain.rpc.answers``. The
  same node answers the same way: not retryable.
"""

from __future__ import annotations

import enum
from typing import Final


class RpcErrorKind(enum.StrEnum):
    UNAVAILABLE = "UNAVAILABLE"
    BAD_REQUEST = "BAD_REQUEST"
    NOT_FOUND = "NOT_FOUND"
    BAD_ANSWER = "BAD_ANSWER"


class RpcError(Exception):
    """A failed request; ``code`` is the JSON-RPC error code when the node sent one,
    ``http_status`` the HTTP status of an answer that was no JSON-RPC answer (with
    ``retry_after_s`` from its Retry-After header), ``too_large`` an answer cut off
    at the client's size limit."""

    def __init__(
        self,
        kind: RpcErrorKind,
        message: str,
        code: int | None = None,
        *,
        http_status: int | None = None,
        retry_after_s: float | None = None,
        too_large: bool = False,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.code = code
        self.http_status = http_status
        self.retry_after_s = retry_after_s
        self.too_large = too_large

    @property
    def retryable(self) -> bool:
        return self.kind is RpcErrorKind.UNAVAILABLE


# JSON-RPC 2.0 codes, and the ones Ethereum nodes add (EIP-1474).
METHOD_NOT_FOUND: Final = -32601
_INVALID_REQUEST: Final = -32600
_INVALID_PARAMS: Final = -32602
_INTERNAL_ERROR: Final = -32603
_RESOURCE_UNAVAILABLE: Final = -32002
_LIMIT_EXCEEDED: Final = -32005

_BUSY_WORDS: Final = ("rate limit", "too many requests", "timeout", "timed out", "try again")
_NOT_FOUND_WORDS: Final = (
    "not found",
    "unknown block",
    "header not found",
    "block not found",
    "missing trie node",
    "historical state",
)


def classify_node_error(code: int, message: str) -> RpcErrorKind:
    """The kind of a JSON-RPC error object the node answered with."""
    lowered = message.lower()
    if code in (_LIMIT_EXCEEDED, _RESOURCE_UNAVAILABLE, _INTERNAL_ERROR) or any(
        word in lowered for word in _BUSY_WORDS
    ):
        return RpcErrorKind.UNAVAILABLE
    if code in (METHOD_NOT_FOUND, _INVALID_REQUEST, _INVALID_PARAMS):
        return RpcErrorKind.BAD_REQUEST
    if any(word in lowered for word in _NOT_FOUND_WORDS):
        return RpcErrorKind.NOT_FOUND
    return RpcErrorKind.BAD_REQUEST


def classify_http_status(status: int) -> RpcErrorKind:
    """The kind of an HTTP answer that is not 200 and carries no JSON-RPC answer."""
    if status == 429 or status >= 500:
        return RpcErrorKind.UNAVAILABLE
    return RpcErrorKind.BAD_REQUEST


def is_method_missing(error: RpcError) -> bool:
    """Whether the node lacks the method (so a fallback may be used)."""
    lowered = error.message.lower()
    return error.code == METHOD_NOT_FOUND or (
        error.kind is RpcErrorKind.BAD_REQUEST
        and ("method not found" in lowered or "does not exist" in lowered)
    )


# How one HTTP exchange of the client's transport fails (``rpc.connection`` raises
# them, ``rpc.http`` turns them into outcomes, the client into RpcError).


class AnswerTooLarge(Exception):
    """The answer passes ``max_response_bytes`` (declared, received or decoded)."""


class ExchangeFailed(Exception):
    """The server's side of an exchange failed: closed early, malformed HTTP, a
    corrupt compressed body."""
