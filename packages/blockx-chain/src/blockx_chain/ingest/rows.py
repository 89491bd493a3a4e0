"""The node's answers as block database rows.

A block comes from ``eth_getBlockByNumber(n, true)`` (its transactions in full) and
its receipts from ``eth_getBlockReceipts(n)`` (or one ``eth_getTransactionReceipt``
per transaction). Quantities become ints; the store checks every value against the
schema (63-bit integers, uint256 decimal strings, lowercase hex) when it writes.
Answers that do not belong together (a receipt of another block, because the node
reorged between the two requests) raise ``Inconsistent`` so the batch is fetched again.
"""

from __future__ import annotations

from typing import Any

from blockx_chain.schema import Block, BlockRows, Log, Transaction


class Inconsistent(Exception):
    """A block and its receipts disagree: the node changed between two requests."""


def _opt_int(value: str | None) -> int | None:
    return None if value is None else int(value, 16)


def block_rows(block: dict[str, Any], receipts: list[dict[str, Any]]) -> BlockRows:
    """One block's rows; ValueError naming the block for an answer that lacks a
    field or has a malformed one."""
    try:
        return _block_rows(block, receipts)
    except (KeyError, TypeError, ValueError) as exc:
        what = f"a missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"block {block.get('number')}: {what}") from None


def _block_rows(block: dict[str, Any], receipts: list[dict[str, Any]]) -> BlockRows:
    number = int(block["number"], 16)
    where = f"block {number}"
    block_hash = str(block.get("hash")).lower()
    txs: list[dict[str, Any]] = block.get("transactions") or []
    if len(receipts) != len(txs):
        raise Inconsistent(f"{where}: {len(txs)} transactions but {len(receipts)} receipts")
    transactions = []
    logs = []
    for tx, receipt in zip(txs, receipts, strict=True):
        if not isinstance(tx, dict):
            raise ValueError("transactions are hashes, not objects (full=false?)")
        tx_hash = str(tx.get("hash")).lower()
        if str(receipt.get("transactionHash")).lower() != tx_hash or (
            str(receipt.get("blockHash")).lower() != block_hash
        ):
            raise Inconsistent(f"{where}: a receipt is not of transaction {tx_hash}")
        index = int(tx["transactionIndex"], 16)
        status = receipt.get("status")
        transactions.append(
            Transaction(
                block_number=number,
                transaction_index=index,
                transaction_hash=tx_hash,
                block_hash=block_hash,
                from_address=tx["from"],
                to_address=tx.get("to"),
                value=int(tx["value"], 16),
                input=tx.get("input", "0x"),
                nonce=int(tx["nonce"], 16),
                gas_limit=int(tx["gas"], 16),
                gas_used=int(receipt["gasUsed"], 16),
                effective_gas_price=_opt_int(receipt.get("effectiveGasPrice")),
                transaction_type=int(tx.get("type", "0x0"), 16),
                success=_opt_int(status),
                contract_address=receipt.get("contractAddress"),
            )
        )
        for log in receipt.get("logs") or []:
            topics: list[str] = log.get("topics") or []
            if len(topics) > 4:
                raise ValueError(f"a log has {len(topics)} topics (at most 4)")
            padded = [*topics, None, None, None, None]
            logs.append(
                Log(
                    block_number=number,
                    log_index=int(log["logIndex"], 16),
                    transaction_index=index,
                    transaction_hash=tx_hash,
                    block_hash=block_hash,
                    address=log["address"],
                    topic0=padded[0],
                    topic1=padded[1],
                    topic2=padded[2],
                    topic3=padded[3],
                    data=log.get("data", "0x"),
                )
            )
    return BlockRows(
        block=Block(
            block_number=number,
            block_hash=block_hash,
            parent_hash=str(block.get("parentHash")).lower(),
            timestamp=int(block["timestamp"], 16),
            miner=block["miner"],
            gas_used=int(block["gasUsed"], 16),
            gas_limit=int(block["gasLimit"], 16),
            base_fee_per_gas=_opt_int(block.get("baseFeePerGas")),
            transaction_count=len(txs),
        ),
        transactions=transactions,
        logs=logs,
    )
