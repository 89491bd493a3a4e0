"""New heads for a following run: ``eth_subscribe("newHeads")`` over the node's
WebSocket, with the poll kept as the fallback.

Once caught up, the run waits for its next look at the node (``Heads.wait``): a
newHeads message wakes it at once, the poll interval otherwise. A message only
wakes the run: the head is then read over HTTP as a poll reads it, so a run with
and without the subscription writes the same blocks.

* The WebSocket: ``CHAIN_WS_URL`` (``blockx_chain.url.resolve_ws_url``), derived from
  the HTTP URL when unset; ``none`` polls only.
* Every message is hostile: a frame above ``MAX_MESSAGE_BYTES`` closes the connection
  (which is made again); a message that is not a newHeads notification of this
  subscription with a block number and a hash is dropped and logged
  (``parse_head``).
* A node without a WebSocket (a refused connection, a refused upgrade, a refused
  ``eth_subscribe``): the run polls, and the subscription is tried again with
  back-off (``RECONNECT_BACKOFF``). The first failure is logged, as a warning when
  ``CHAIN_WS_URL`` named the URL, as information when it was derived.
* A subscription that stalls: the poll goes on at its interval whatever happens;
  when the polls see a head above the last one pushed for ``STALL_MS``
  (``StallCheck``), the connection is dropped and made again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import TYPE_CHECKING, Any, Final

import msgspec

from blockx_chain.rpc import RpcError
from blockx_chain.rpc.answers import block_number, hash_value
from blockx_core.backoff import Backoff

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

_log = logging.getLogger(__name__)

# A header is about 1.5 KB of JSON; anything far above is not one.
MAX_MESSAGE_BYTES: Final = 65_536
# Connect (TCP, TLS and the upgrade) and the eth_subscribe answer, each.
CONNECT_TIMEOUT_S: Final = 5.0
RECONNECT_BACKOFF: Final = Backoff(initial_s=0.5, max_s=30.0)
# The polls see a head the subscription has not pushed for this long: it stalled.
STALL_MS: Final = 5_000
_SUBSCRIBE_ID: Final = 1
_MAX_SUBSCRIPTION_ID: Final = 130
# Dropped messages logged one by one, then one in _LOG_EVERY.
_LOG_FIRST: Final = 10
_LOG_EVERY: Final = 1000


# ---- pure: the messages and the stall check ---------------------------------------


class Head(msgspec.Struct, frozen=True, tag=True):
    number: int
    hash: str


class Dropped(msgspec.Struct, frozen=True, tag=True):
    reason: str


HeadMessage = Head | Dropped


class _Header(msgspec.Struct):
    number: Any = None
    hash: Any = None


class _Params(msgspec.Struct):
    subscription: Any = None
    result: _Header | None = None


class _Notification(msgspec.Struct):
    method: Any = None
    params: _Params | None = None


class _Reply(msgspec.Struct):
    id: Any = None
    result: Any = None
    error: Any = None


def parse_head(message: bytes, subscription: str) -> HeadMessage:
    """One message of the subscription ``subscription``: the head it announces, or
    why it is dropped."""
    try:
        note = msgspec.json.decode(message, type=_Notification)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return Dropped(f"not a notification: {exc}")
    if note.method != "eth_subscription" or note.params is None:
        return Dropped(f"not an eth_subscription notification (method {_shown(note.method)})")
    if note.params.subscription != subscription:
        return Dropped(f"of another subscription ({_shown(note.params.subscription)})")
    header = note.params.result
    if header is None:
        return Dropped("a notification without a header")
    try:
        return Head(block_number(header.number, "number"), hash_value(header.hash, "hash"))
    except RpcError as exc:
        return Dropped(f"a header that does not parse: {exc.message}")


def subscription_id(message: bytes) -> str | Dropped:
    """The id in the answer to ``eth_subscribe``, or why the answer is refused."""
    try:
        reply = msgspec.json.decode(message, type=_Reply)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return Dropped(f"not a JSON-RPC answer: {exc}")
    if reply.id != _SUBSCRIBE_ID:
        return Dropped(f"an answer to another request ({_shown(reply.id)})")
    if reply.error is not None:
        return Dropped(f"eth_subscribe refused: {_shown(reply.error)}")
    result = reply.result
    if not isinstance(result, str) or not 0 < len(result) <= _MAX_SUBSCRIPTION_ID:
        return Dropped(f"not a subscription id: {_shown(result)}")
    return result


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class StallCheck:
    """Whether a live subscription stalled: the polls keep seeing a head above the
    last one it pushed. Time is an argument (``now_ms``)."""

    def __init__(self, stall_ms: int = STALL_MS) -> None:
        self._stall_ms = stall_ms
        self._pushed: int | None = None
        self._behind_since: int | None = None

    def live(self) -> None:
        """A new subscription: nothing pushed yet."""
        self._pushed = None
        self._behind_since = None

    def pushed(self, number: int) -> None:
        self._pushed = number
        self._behind_since = None

    def stalled(self, polled: int, now_ms: int) -> bool:
        """After a poll that read the head ``polled``: whether the subscription has
        been behind the polls for ``stall_ms``."""
        if self._pushed is not None and polled <= self._pushed:
            self._behind_since = None
            return False
        if self._behind_since is None:
            self._behind_since = now_ms
            return False
        return now_ms - self._behind_since >= self._stall_ms


# ---- the adapter ------------------------------------------------------------------


class Heads:
    """The run's wake-ups: pushed heads from ``url``'s subscription (None: poll only)."""

    def __init__(self, url: str | None, *, derived: bool = False, stall_ms: int = STALL_MS) -> None:
        self.url = url
        # A URL derived from the HTTP one may well serve no WebSocket (most hosted
        # nodes serve it elsewhere): failing to subscribe there is no warning.
        self._derived = derived
        self._wake = asyncio.Event()
        self._stall = StallCheck(stall_ms)
        self._ws: ClientConnection | None = None
        self._closing: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        # Messages dropped, heads pushed and subscriptions made so far.
        self.dropped = 0
        self.pushed = 0
        self.subscriptions = 0

    async def __aenter__(self) -> Heads:
        if self.url is not None:
            self._task = asyncio.create_task(self._run(self.url), name="newHeads")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait(self, stop: asyncio.Event, timeout_s: float) -> None:
        """Until a head is pushed, ``stop`` is set or ``timeout_s`` passed (a head
        pushed meanwhile returns at once)."""
        if not self._wake.is_set():
            waiters = [asyncio.ensure_future(e.wait()) for e in (stop, self._wake)]
            try:
                await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
        self._wake.clear()

    def polled(self, head: int) -> None:
        """The run read the node's head: a subscription behind the polls for too long
        is made again."""
        ws = self._ws
        if ws is None or not self._stall.stalled(head, int(time.time() * 1000)):
            return
        _log.warning(
            "the newHeads subscription at %s pushed nothing up to block %d: connecting again",
            self.url,
            head,
        )
        self._ws = None
        self._closing = asyncio.create_task(ws.close())

    async def _run(self, url: str) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import WebSocketException

        while True:
            try:
                async with connect(
                    url,
                    max_size=MAX_MESSAGE_BYTES,
                    max_queue=16,
                    open_timeout=CONNECT_TIMEOUT_S,
                    close_timeout=1.0,
                    compression=None,
                ) as ws:
                    await self._subscribed(ws, url)
            except (OSError, TimeoutError, WebSocketException, _Refused) as exc:
                self._failed(url, exc)
            except Exception:
                # Pushes are only wake-ups: whatever else breaks them, the run polls.
                _log.exception("the newHeads subscription at %s failed", url)
            finally:
                self._ws = None
            self._failures += 1
            await asyncio.sleep(RECONNECT_BACKOFF.delay(self._failures, random.random()))

    async def _subscribed(self, ws: ClientConnection, url: str) -> None:
        await ws.send(
            msgspec.json.encode(
                {
                    "jsonrpc": "2.0",
                    "id": _SUBSCRIBE_ID,
                    "method": "eth_subscribe",
                    "params": ["newHeads"],
                }
            ).decode()
        )
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            answer = subscription_id(await ws.recv(decode=False))
        if isinstance(answer, Dropped):
            raise _Refused(answer.reason)
        _log.info("subscribed to newHeads at %s", url)
        self.subscriptions += 1
        self._failures = 0
        self._stall.live()
        self._ws = ws
        self._wake.set()  # heads may have come while there was no subscription
        while True:
            match parse_head(await ws.recv(decode=False), answer):
                case Head(number=number):
                    self.pushed += 1
                    self._stall.pushed(number)
                    self._wake.set()
                case Dropped(reason=reason):
                    self.dropped += 1
                    if self.dropped <= _LOG_FIRST or self.dropped % _LOG_EVERY == 0:
                        _log.warning(
                            "dropped a message of the newHeads subscription at %s (%d so far): %s",
                            url,
                            self.dropped,
                            reason,
                        )

    def _failed(self, url: str, exc: BaseException) -> None:
        level = logging.DEBUG
        if self._failures == 0:
            level = logging.INFO if self._derived else logging.WARNING
        _log.log(
            level,
            "no newHeads subscription at %s (%s: %s): polling the head; trying again "
            "(CHAIN_WS_URL=none polls only)",
            url,
            type(exc).__name__,
            exc,
        )


class _Refused(Exception):
    """The node refused the subscription or answered it with no id."""
