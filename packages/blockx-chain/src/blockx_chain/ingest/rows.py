"""The node's answers as block database rows.

A block comes from ``eth_getBlockByNumber(n, true)`` (its transactions in full) and
its receipts from ``eth_getBlockReceipts(n)`` (or one ``eth_getTransactionReceipt``
per transaction), both already checked against their requests
(``blockx_chain.rpc.answers``). Quantities become ints (a malformed one is
BAD_ANSWER, naming its field); the store checks every value against the schema
(63-bit integers, uint256 decimal strings, lowercase hex) when it writes. Receipts
of another block with the same number (the node reorged between the two requests)
raise ``Inconsistent`` so the batch is fetched again; receipts of this very block
that are not of its transactions, in order, are BAD_ANSWER.
"""

from __future__ import annotations

from typing import Any

import msgspec

from blockx_chain.ingest.traces import OtherBlock, TracedTransaction, TraceMethod, block_traces
from blockx_chain.rpc import parse_quantity, quantity
from blockx_chain.rpc.answers import bad_answer, call_text, check_receipts, field, shown
from blockx_chain.schema import Block, BlockRows, Log, Trace, Transaction


class Inconsistent(Exception):
    """A block and its receipts disagree: the node changed between two requests."""


def _int(obj: dict[str, Any], name: str, where: str) -> int:
    return parse_quantity(field(obj, name, where), f"{where}.{name}")


def _opt_int(obj: dict[str, Any], name: str, where: str) -> int | None:
    value = obj.get(name)
    return None if value is None else parse_quantity(value, f"{where}.{name}")


class Traced(msgspec.Struct, frozen=True):
    """A block's frames as ``method`` answered them (not yet checked)."""

    method: TraceMethod
    answer: Any


def block_rows(
    block: dict[str, Any], receipts: list[dict[str, Any]], traced: Traced | None = None
) -> BlockRows:
    """One block's rows, from a checked block, its checked receipts and, with
    traces, the answer of the node's trace method (checked here)."""
    number = parse_quantity(block["number"])
    what = call_text("eth_getBlockByNumber", [quantity(number), True])
    block_hash = block["hash"].lower()
    txs: list[dict[str, Any]] = block["transactions"]
    other_block = receipts and receipts[0]["blockHash"].lower() != block_hash
    if other_block or (txs and not receipts):
        raise Inconsistent(f"block {number}: its receipts are of another block {number}")
    check_receipts(
        receipts,
        f"receipts of block {number}",
        block_hash=block_hash,
        transactions=[tx["hash"].lower() for tx in txs],
    )
    transactions = []
    logs = []
    for tx, receipt in zip(txs, receipts, strict=True):
        index = _int(tx, "transactionIndex", what)
        at = f"{what}: transactions[{index}]"
        receipt_at = f"receipts of block {number}: [{index}]"
        transactions.append(
            Transaction(
                block_number=number,
                transaction_index=index,
                transaction_hash=tx["hash"].lower(),
                block_hash=block_hash,
                from_address=field(tx, "from", at),
                to_address=tx.get("to"),
                value=_int(tx, "value", at),
                input=tx.get("input", "0x"),
                nonce=_int(tx, "nonce", at),
                gas_limit=_int(tx, "gas", at),
                gas_used=_int(receipt, "gasUsed", receipt_at),
                effective_gas_price=_opt_int(receipt, "effectiveGasPrice", receipt_at),
                transaction_type=_opt_int(tx, "type", at) or 0,
                success=_opt_int(receipt, "status", receipt_at),
                contract_address=receipt.get("contractAddress"),
            )
        )
        for position, log in enumerate(receipt.get("logs") or []):
            log_at = f"{receipt_at}.logs[{position}]"
            topics = log.get("topics") or []
            if not isinstance(topics, list) or len(topics) > 4:
                raise bad_answer(f"{log_at}.topics", f"not a list of at most 4: {shown(topics)}")
            padded = [*topics, None, None, None, None]
            logs.append(
                Log(
                    block_number=number,
                    log_index=_int(log, "logIndex", log_at),
                    transaction_index=index,
                    transaction_hash=tx["hash"].lower(),
                    block_hash=block_hash,
                    address=field(log, "address", log_at),
                    topic0=padded[0],
                    topic1=padded[1],
                    topic2=padded[2],
                    topic3=padded[3],
                    data=log.get("data", "0x"),
                )
            )
    traces: list[Trace] = []
    if traced is not None:
        tops = [
            TracedTransaction(tx.transaction_hash, tx.gas_limit, tx.gas_used) for tx in transactions
        ]
        try:
            traces = block_traces(traced.method, traced.answer, number, block_hash, tops)
        except OtherBlock as exc:
            raise Inconsistent(str(exc)) from None
    return BlockRows(
        block=header_row(block, full=True),
        transactions=transactions,
        logs=logs,
        traces=traces,
    )


def header_row(block: dict[str, Any], *, full: bool) -> Block:
    """The ``blocks`` row of a checked block, asked in ``full`` or with its
    transactions' hashes."""
    number = parse_quantity(block["number"])
    # call_text's words for the request, built cheaply: thousands of headers a run.
    what = f"eth_getBlockByNumber({quantity(number)}, {'true' if full else 'false'})"
    return Block(
        block_number=number,
        block_hash=block["hash"].lower(),
        parent_hash=block["parentHash"].lower(),
        timestamp=_int(block, "timestamp", what),
        miner=field(block, "miner", what),
        gas_used=_int(block, "gasUsed", what),
        gas_limit=_int(block, "gasLimit", what),
        base_fee_per_gas=_opt_int(block, "baseFeePerGas", what),
        transaction_count=len(block["transactions"]),
    )
