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


def _int(value: Any, what: str) -> int:
    if not isinstance(value, str) or not value.startswith("0x"):
        raise ValueError(f"{what} is not a JSON-RPC quantity: {value!r}")
    return int(value, 16)


def _opt_int(value: Any, what: str) -> int | None:
    return None if value is None else _int(value, what)


def block_rows(block: dict[str, Any], receipts: list[dict[str, Any]]) -> BlockRows:
    """One block's rows; ValueError for an answer missing a required field."""
    number = _int(block.get("number"), "block number")
    where = f"block {number}"
    block_hash = str(block.get("hash")).lower()
    txs: list[dict[str, Any]] = block.get("transactions") or []
    if len(receipts) != len(txs):
        raise Inconsistent(f"{where}: {len(txs)} transactions but {len(receipts)} receipts")
    transactions = []
    logs = []
    for tx, receipt in zip(txs, receipts, strict=True):
        if not isinstance(tx, dict):
            raise ValueError(f"{where}: transactions are hashes, not objects (full=false?)")
        tx_hash = str(tx.get("hash")).lower()
        if str(receipt.get("transactionHash")).lower() != tx_hash or (
            str(receipt.get("blockHash")).lower() != block_hash
        ):
            raise Inconsistent(f"{where}: a receipt is not of transaction {tx_hash}")
        index = _int(tx.get("transactionIndex"), f"{where} transactionIndex")
        status = receipt.get("status")
        transactions.append(
            Transaction(
                block_number=number,
                transaction_index=index,
                transaction_hash=tx_hash,
                block_hash=block_hash,
                from_address=tx["from"],
                to_address=tx.get("to"),
                value=_int(tx.get("value"), f"{where} tx {index} value"),
                input=tx.get("input", "0x"),
                nonce=_int(tx.get("nonce"), f"{where} tx {index} nonce"),
                gas_limit=_int(tx.get("gas"), f"{where} tx {index} gas"),
                gas_used=_int(receipt.get("gasUsed"), f"{where} tx {index} gasUsed"),
                effective_gas_price=_opt_int(
                    receipt.get("effectiveGasPrice"), f"{where} tx {index} effectiveGasPrice"
                ),
                transaction_type=_int(tx.get("type", "0x0"), f"{where} tx {index} type"),
                success=_opt_int(status, f"{where} tx {index} status"),
                contract_address=receipt.get("contractAddress"),
            )
        )
        for log in receipt.get("logs") or []:
            topics: list[str] = log.get("topics") or []
            if len(topics) > 4:
                raise ValueError(f"{where}: a log has {len(topics)} topics (at most 4)")
            padded = [*topics, None, None, None, None]
            logs.append(
                Log(
                    block_number=number,
                    log_index=_int(log.get("logIndex"), f"{where} logIndex"),
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
            timestamp=_int(block.get("timestamp"), f"{where} timestamp"),
            miner=block["miner"],
            gas_used=_int(block.get("gasUsed"), f"{where} gasUsed"),
            gas_limit=_int(block.get("gasLimit"), f"{where} gasLimit"),
            base_fee_per_gas=_opt_int(block.get("baseFeePerGas"), f"{where} baseFeePerGas"),
            transaction_count=len(txs),
        ),
        transactions=transactions,
        logs=logs,
    )
