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

Every field of a transaction and of its receipt is kept: in its column, or, when
the schema has no column for it (an L2 deposit's ``sourceHash``, ``mint`` and
``isSystemTx``, an OP receipt's ``l1Fee``, a field of a type not yet known), in
the transaction's ``extra``: ``{"transaction": {...}, "receipt": {...}}`` with
the fields as the node gave them, each part present only when it has a field,
and NULL when every field has a column. Left out on purpose are the fields that
repeat another column (``blockHash``, ``blockNumber``, ``blockTimestamp``,
``transactionIndex``, a receipt's ``from``, ``to``, ``type`` and
``transactionHash``) and the receipt's ``logsBloom``, which its logs determine.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from blockx_chain.ingest.traces import OtherBlock, TracedTransaction, TraceMethod, block_traces
from blockx_chain.rpc import parse_quantity, quantity
from blockx_chain.rpc.answers import bad_answer, call_text, check_receipts, field, shown
from blockx_chain.schema import Block, BlockRows, Log, Trace, Transaction, Withdrawal

# The fields of a transaction object and of a receipt that a column holds (or that
# repeat one); any other field goes to ``extra``.
TRANSACTION_FIELDS: Final = frozenset(
    {
        "blockHash",
        "blockNumber",
        "blockTimestamp",
        "hash",
        "transactionIndex",
        "type",
        "from",
        "to",
        "value",
        "input",
        "nonce",
        "gas",
        "gasPrice",
        "maxFeePerGas",
        "maxPriorityFeePerGas",
        "maxFeePerBlobGas",
        "blobVersionedHashes",
        "chainId",
        "accessList",
        "authorizationList",
        "v",
        "r",
        "s",
        "yParity",
    }
)
RECEIPT_FIELDS: Final = frozenset(
    {
        "blockHash",
        "blockNumber",
        "blockTimestamp",
        "transactionHash",
        "transactionIndex",
        "type",
        "from",
        "to",
        "contractAddress",
        "cumulativeGasUsed",
        "gasUsed",
        "effectiveGasPrice",
        "status",
        "root",
        "blobGasUsed",
        "blobGasPrice",
        "logs",
        "logsBloom",
    }
)


class Inconsistent(Exception):
    """A block and its receipts disagree: the node changed between two requests."""


# A well-formed quantity, checked inline: the message (and parse_quantity) is only
# for a malformed one. Every block, transaction and receipt has a dozen or more.
_QUANTITY: Final = re.compile(r"0x[0-9a-fA-F]{1,64}").fullmatch


def _int(obj: dict[str, Any], name: str, where: str) -> int:
    value = obj.get(name)
    if type(value) is str and _QUANTITY(value) is not None:
        return int(value, 16)
    return parse_quantity(field(obj, name, where), f"{where}.{name}")


def _opt_int(obj: dict[str, Any], name: str, where: str) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    if type(value) is str and _QUANTITY(value) is not None:
        return int(value, 16)
    return parse_quantity(value, f"{where}.{name}")


# The optional quantities read in one call each (one frame instead of one per
# field: a block has a hundred of them or more).
_HEADER_QUANTITIES: Final = (
    "difficulty",
    "totalDifficulty",
    "size",
    "blobGasUsed",
    "excessBlobGas",
)
_TRANSACTION_QUANTITIES: Final = (
    "gasPrice",
    "maxFeePerGas",
    "maxPriorityFeePerGas",
    "maxFeePerBlobGas",
    "chainId",
    "v",
    "yParity",
)
_RECEIPT_QUANTITIES: Final = ("cumulativeGasUsed", "blobGasUsed", "blobGasPrice")


def _opt_ints(obj: dict[str, Any], names: tuple[str, ...], where: str) -> list[int | None]:
    values: list[int | None] = []
    for name in names:
        value = obj.get(name)
        if value is None:
            values.append(None)
        elif type(value) is str and _QUANTITY(value) is not None:
            values.append(int(value, 16))
        else:
            values.append(parse_quantity(value, f"{where}.{name}"))
    return values


def _opt_list(obj: dict[str, Any], name: str, where: str) -> list[Any] | None:
    value = obj.get(name)
    if value is None or isinstance(value, list):
        return value
    raise bad_answer(f"{where}.{name}", f"not a list: {shown(value)}")


def _opt_word(obj: dict[str, Any], name: str, where: str) -> str | None:
    """A 256-bit quantity (a signature's r or s) as 32 bytes of hex: a node drops
    leading zero digits. Already 32 bytes, it goes as it is to the store's check."""
    value = obj.get(name)
    if value is None or (type(value) is str and len(value) == 66):
        return value
    return f"0x{parse_quantity(value, f'{where}.{name}'):064x}"


def _extra(tx: dict[str, Any], receipt: dict[str, Any]) -> dict[str, Any] | None:
    extra: dict[str, Any] = {}
    if not TRANSACTION_FIELDS.issuperset(tx):
        extra["transaction"] = {k: v for k, v in tx.items() if k not in TRANSACTION_FIELDS}
    if not RECEIPT_FIELDS.issuperset(receipt):
        extra["receipt"] = {k: v for k, v in receipt.items() if k not in RECEIPT_FIELDS}
    return extra or None


def _withdrawals(
    block: dict[str, Any], number: int, block_hash: str, what: str
) -> list[Withdrawal]:
    listed = _opt_list(block, "withdrawals", what) or []
    withdrawals = []
    for position, item in enumerate(listed):
        at = f"{what}: withdrawals[{position}]"
        if not isinstance(item, dict):
            raise bad_answer(at, f"not an object: {shown(item)}")
        withdrawals.append(
            Withdrawal(
                block_number=number,
                block_hash=block_hash,
                position=position,
                withdrawal_index=_int(item, "index", at),
                validator_index=_int(item, "validatorIndex", at),
                address=field(item, "address", at),
                amount=_int(item, "amount", at),
            )
        )
    return withdrawals


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
    hashes = [tx["hash"].lower() for tx in txs]
    # The receipts' own check (``check_receipts`` of block ``number``, by EthRpc)
    # found them all of one block, in order, their logs theirs: what is left is
    # that they are this block's transactions'. The full check runs only when
    # that fails, for its message (or when a hash differs only in case).
    if len(receipts) != len(hashes) or any(
        r.get("transactionHash") != h for r, h in zip(receipts, hashes, strict=True)
    ):
        check_receipts(
            receipts, f"receipts of block {number}", block_hash=block_hash, transactions=hashes
        )
    transactions = []
    logs = []
    for tx, receipt in zip(txs, receipts, strict=True):
        index = _int(tx, "transactionIndex", what)
        at = f"{what}: transactions[{index}]"
        receipt_at = f"receipts of block {number}: [{index}]"
        fees = _opt_ints(tx, _TRANSACTION_QUANTITIES, at)
        gas = _opt_ints(receipt, _RECEIPT_QUANTITIES, receipt_at)
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
                gas_price=fees[0],
                max_fee_per_gas=fees[1],
                max_priority_fee_per_gas=fees[2],
                max_fee_per_blob_gas=fees[3],
                blob_versioned_hashes=_opt_list(tx, "blobVersionedHashes", at),
                chain_id=fees[4],
                access_list=_opt_list(tx, "accessList", at),
                authorization_list=_opt_list(tx, "authorizationList", at),
                v=fees[5],
                r=_opt_word(tx, "r", at),
                s=_opt_word(tx, "s", at),
                y_parity=fees[6],
                cumulative_gas_used=gas[0],
                receipt_root=receipt.get("root"),
                blob_gas_used=gas[1],
                blob_gas_price=gas[2],
                extra=_extra(tx, receipt),
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
        withdrawals=_withdrawals(block, number, block_hash, what),
    )


def header_row(block: dict[str, Any], *, full: bool) -> Block:
    """The ``blocks`` row of a checked block, asked in ``full`` or with its
    transactions' hashes."""
    number = parse_quantity(block["number"])
    # call_text's words for the request, built cheaply: thousands of headers a run.
    what = f"eth_getBlockByNumber({quantity(number)}, {'true' if full else 'false'})"
    uncles = _opt_list(block, "uncles", what)
    header = _opt_ints(block, _HEADER_QUANTITIES, what)
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
        nonce=block.get("nonce"),
        mix_hash=block.get("mixHash"),
        sha3_uncles=block.get("sha3Uncles"),
        logs_bloom=block.get("logsBloom"),
        transactions_root=block.get("transactionsRoot"),
        state_root=block.get("stateRoot"),
        receipts_root=block.get("receiptsRoot"),
        difficulty=header[0],
        total_difficulty=header[1],
        size=header[2],
        extra_data=block.get("extraData"),
        withdrawals_root=block.get("withdrawalsRoot"),
        blob_gas_used=header[3],
        excess_blob_gas=header[4],
        parent_beacon_block_root=block.get("parentBeaconBlockRoot"),
        requests_hash=block.get("requestsHash"),
        uncle_count=None if uncles is None else len(uncles),
    )
