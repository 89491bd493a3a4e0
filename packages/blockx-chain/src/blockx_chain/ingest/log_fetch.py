"""Fetching a range of blocks for a selective ingest: the logs that match the
database's filter (``eth_getLogs``, as wide as ``LogRanges`` allows), and the
headers of the blocks they fall in, of the blocks near the node's head, and of the
range's last block (``eth_getBlockByNumber(n, false)``).

The adapter of ``blockx_chain.ingest.log_ranges``: it reads the clock, sleeps and
asks; the widths are the sizer's. Every answer is checked against its request
first (``blockx_chain.rpc.answers``: logs inside the range, of the addresses and
topics asked), then against the headers:

* the range's last block is read before the logs and again after them: a
  different hash means the node reorged in between, and the range is fetched
  again (``Inconsistent``), as is a log naming another hash than its block's
  header, a ``removed`` log, or headers near the head that do not chain;
* a log whose transaction is not the header's at its index, or two logs at the
  same index of a block, is BAD_ANSWER.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import msgspec

from blockx_chain.ingest.errors import NodeUnusable
from blockx_chain.ingest.fetch import RETRY_ATTEMPTS, backoff_s, retried
from blockx_chain.ingest.log_ranges import Ask, GiveUp, LogRanges, Span, Wait, classify
from blockx_chain.ingest.rows import Inconsistent, header_row
from blockx_chain.rpc import EthRpc, RpcError, RpcErrorKind, parse_quantity, quantity
from blockx_chain.rpc.answers import bad_answer, field, hash_value, shown
from blockx_chain.schema import BlockRows, Log, LogFilterRecord


class LogQuery(msgspec.Struct, frozen=True, kw_only=True):
    """The filter of every ``eth_getLogs`` of a run (lowercase, sorted)."""

    addresses: tuple[str, ...] = ()
    topic0s: tuple[str, ...] = ()

    def params(self, span: Span) -> dict[str, Any]:
        query: dict[str, Any] = {"fromBlock": quantity(span.first), "toBlock": quantity(span.last)}
        if self.addresses:
            query["address"] = list(self.addresses)
        if self.topic0s:
            query["topics"] = [list(self.topic0s)]
        return query

    def record(self, from_block: int) -> LogFilterRecord:
        return LogFilterRecord(
            addresses=self.addresses, topic0s=self.topic0s, from_block=from_block
        )


class LogFetcher:
    def __init__(
        self, eth: EthRpc, query: LogQuery, ranges: LogRanges, attempts: int = RETRY_ATTEMPTS
    ) -> None:
        self.eth = eth
        self.query = query
        self.ranges = ranges
        self.attempts = attempts
        self.rate_limited_s = 0.0

    async def blocks(self, numbers: range, near_head: int) -> list[BlockRows]:
        """Rows of the blocks of ``numbers`` that hold a matching log, are at or above
        ``near_head``, or are the range's last block, in block order."""
        return await retried(numbers, self.attempts, lambda: self._once(numbers, near_head))

    async def _once(self, numbers: range, near_head: int) -> list[BlockRows]:
        last = numbers.stop - 1
        pinned = await self.eth.get_block(last, full=False)
        logs = await self._logs(Span(numbers.start, last))
        by_block: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for log in logs:
            by_block[parse_quantity(log["blockNumber"])].append(log)
        wanted = sorted({*by_block, *range(max(near_head, numbers.start), last + 1), last})
        headers = await self.eth.get_blocks(wanted, full=False)
        if headers[-1]["hash"].lower() != pinned["hash"].lower():
            raise Inconsistent(f"block {last} changed while its logs were read")
        for before, after in itertools.pairwise(headers):
            if parse_quantity(after["number"]) == parse_quantity(before["number"]) + 1 and (
                after["parentHash"].lower() != before["hash"].lower()
            ):
                raise Inconsistent(f"block {parse_quantity(after['number'])} is not on its parent")
        return [
            BlockRows(
                block=header_row(header, full=False),
                logs=_log_rows(header, by_block.get(parse_quantity(header["number"]), [])),
            )
            for header in headers
        ]

    async def _logs(self, span: Span) -> list[dict[str, Any]]:
        """Every matching log of ``span``, in as many requests as the node needs."""
        logs: list[dict[str, Any]] = []
        at = span.first
        failures = 0
        while at <= span.last:
            decision = self.ranges.next(at, span.last, _now_ms())
            match decision:
                case Wait(until_ms):
                    wait_s = max(0.0, (until_ms - _now_ms()) / 1000)
                    self.rate_limited_s += wait_s
                    await asyncio.sleep(wait_s)
                    continue
                case GiveUp(reason):
                    raise NodeUnusable(f"eth_getLogs of blocks {span.first}..{span.last}: {reason}")
                case Ask(piece):
                    pass
            try:
                answer = await self.eth.get_logs(self.query.params(piece))
            except RpcError as exc:
                refused = classify(
                    exc.message,
                    http_status=exc.http_status,
                    retry_after_s=exc.retry_after_s,
                    too_large=exc.too_large,
                )
                if refused is None:
                    failures += 1
                    if exc.kind is RpcErrorKind.UNAVAILABLE and failures < self.attempts:
                        await asyncio.sleep(backoff_s(failures))
                        continue
                    raise
                if self.ranges.cannot_split(piece, refused):
                    raise NodeUnusable(
                        f"block {piece.first} alone holds more matching logs than the node "
                        f"answers at once: {exc.message}"
                    ) from None
                self.ranges.on_refused(piece, refused, _now_ms())
                continue
            failures = 0
            self.ranges.on_answer(piece, len(answer), _now_ms())
            logs += answer
            at = piece.last + 1
        return logs


def _log_rows(header: dict[str, Any], logs: Sequence[dict[str, Any]]) -> list[Log]:
    """The ``logs`` rows of one block's logs, checked against its header."""
    number = parse_quantity(header["number"])
    block_hash = header["hash"].lower()
    transactions: list[str] = header["transactions"]
    rows: list[Log] = []
    seen: set[int] = set()
    for log in logs:
        where = f"eth_getLogs: a log of block {number}"
        named = hash_value(field(log, "blockHash", where), f"{where}.blockHash")
        if named != block_hash or log.get("removed") is True:
            raise Inconsistent(f"a log of block {number} is of another block {number}")
        index = parse_quantity(field(log, "logIndex", where), f"{where}.logIndex")
        where = f"eth_getLogs: log {index} of block {number}"
        if index in seen:
            raise bad_answer(where, "answered twice")
        seen.add(index)
        tx_index = parse_quantity(
            field(log, "transactionIndex", where), f"{where}.transactionIndex"
        )
        tx_hash = hash_value(field(log, "transactionHash", where), f"{where}.transactionHash")
        if tx_index >= len(transactions) or transactions[tx_index].lower() != tx_hash:
            raise bad_answer(
                where,
                f"transaction {tx_hash} is not the block's transaction {tx_index} "
                f"({len(transactions)} transactions)",
            )
        topics = log.get("topics") or []
        if not isinstance(topics, list) or len(topics) > 4:
            raise bad_answer(f"{where}.topics", f"not a list of at most 4: {shown(topics)}")
        padded = [*topics, None, None, None, None]
        rows.append(
            Log(
                block_number=number,
                log_index=index,
                transaction_index=tx_index,
                transaction_hash=tx_hash,
                block_hash=block_hash,
                address=field(log, "address", where),
                topic0=padded[0],
                topic1=padded[1],
                topic2=padded[2],
                topic3=padded[3],
                data=log.get("data", "0x"),
            )
        )
    rows.sort(key=lambda row: row.log_index)
    return rows


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _span(numbers: range) -> str:
    return f"{numbers.start}..{numbers.stop - 1}"
