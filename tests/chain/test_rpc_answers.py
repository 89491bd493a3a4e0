"""The checks a node's answer meets before ingest or ``io.rpc`` believes it
(``blockx_chain.rpc.answers``), as a table: each answer is accepted as it is, or
refused BAD_ANSWER with one line naming what was asked and what came back."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from rpc_scripted import TOKEN, block_hash, chain_block, chain_receipts, tx_hash

from blockx_chain.contracts import TRANSFER_TOPIC
from blockx_chain.rpc import RpcError, RpcErrorKind
from blockx_chain.rpc.answers import check_answer, check_receipts


def edited(value: Any, edit: Callable[[Any], None]) -> Any:
    changed = copy.deepcopy(value)
    edit(changed)
    return changed


B11 = chain_block(11, full=True)
H11 = chain_block(11, full=False)
R11 = chain_receipts(11)
LOG = R11[0]["logs"][0]
RANGE = {"fromBlock": "0xa", "toBlock": "0xc", "address": TOKEN, "topics": [TRANSFER_TOPIC]}
OTHER = "0x" + "ee" * 32

ACCEPTED = [
    # (method, params, answer)
    ("eth_getBlockByNumber", ["0xb", True], B11),
    ("eth_getBlockByNumber", ["0xb", False], H11),
    ("eth_getBlockByHash", [block_hash(11), False], H11),
    ("eth_getBlockByHash", [block_hash(11).upper().replace("0X", "0x"), True], B11),
    ("eth_getBlockByNumber", ["finalized", False], H11),
    ("eth_getBlockByNumber", ["pending", False], {"number": None, "hash": None}),
    ("eth_getBlockReceipts", ["0xb"], R11),
    ("eth_getBlockReceipts", [block_hash(11)], R11),
    ("eth_getBlockReceipts", [{"blockHash": block_hash(11)}], R11),
    ("eth_getBlockReceipts", ["latest"], R11),
    ("eth_getTransactionReceipt", [tx_hash(11)], R11[0]),
    ("eth_getTransactionByHash", [tx_hash(11)], B11["transactions"][0]),
    ("eth_getLogs", [RANGE], [LOG]),
    ("eth_getLogs", [{"blockHash": block_hash(11)}], [LOG]),
    ("eth_getLogs", [{"fromBlock": "0xb", "topics": [None, [OTHER, LOG["topics"][1]]]}], [LOG]),
    ("eth_blockNumber", [], "0x10"),
    ("eth_getBalance", [TOKEN, "latest"], "0x" + "f" * 64),
    ("eth_call", [{"to": TOKEN, "data": "0x"}, "latest"], "0x"),
    ("eth_feeHistory", [4, "latest", []], {"anything": "goes"}),  # nothing to compare
    # Parameters the check cannot read: the node judged them.
    ("eth_getBlockByNumber", ["soon", False], H11),
]


@pytest.mark.parametrize(("method", "params", "answer"), ACCEPTED)
def test_answers_that_are_what_was_asked_for_pass_as_they_are(
    method: str, params: list[Any], answer: Any
) -> None:
    assert check_answer(method, params, answer) is answer


REFUSED = [
    # (method, params, answer, words of the one-line error)
    (
        "eth_getBlockByNumber",
        ["0xb", True],
        chain_block(111, full=True),
        "eth_getBlockByNumber(0xb, true): the node answered block 111, not block 11",
    ),
    (
        "eth_getBlockByHash",
        [OTHER, False],
        H11,
        f"the node answered block 11 {block_hash(11)}, not block {OTHER}",
    ),
    ("eth_getBlockByNumber", ["finalized", False], "a block", "not an object: 'a block'"),
    (
        "eth_getBlockByNumber",
        ["finalized", False],
        edited(H11, lambda b: b.pop("number")),
        "eth_getBlockByNumber(finalized, false): number is missing",
    ),
    ("eth_getBlockByNumber", ["0xb", False], {**H11, "hash": "0x11"}, "hash: not a 32-byte hash"),
    ("eth_getBlockByNumber", ["0xb", False], {**H11, "transactions": "0x"}, "not a list"),
    ("eth_getBlockByNumber", ["0xb", False], B11, "transactions[0]: not a hash"),
    ("eth_getBlockByNumber", ["0xb", True], H11, "transactions[0]: not an object"),
    (
        "eth_getBlockByNumber",
        ["0xb", True],
        edited(B11, lambda b: b["transactions"][0].update(blockNumber="0xc")),
        "transactions[0]: blockNumber 12, not 11",
    ),
    (
        "eth_getBlockByNumber",
        ["0xb", True],
        edited(B11, lambda b: b["transactions"][0].update(blockHash=OTHER)),
        f"transactions[0]: blockHash {OTHER}",
    ),
    (
        "eth_getBlockByNumber",
        ["0xb", True],
        edited(B11, lambda b: b["transactions"][0].update(transactionIndex="0x1")),
        "transactionIndex 1, not 0",
    ),
    (
        "eth_getBlockReceipts",
        ["0xb"],
        chain_receipts(111),
        "eth_getBlockReceipts(0xb): [0]: a receipt of block 111, not of block 11",
    ),
    (
        "eth_getBlockReceipts",
        [{"blockHash": OTHER}],
        R11,
        f'eth_getBlockReceipts({{"blockHash":"{OTHER}"}}): [0]: a receipt of block',
    ),
    (
        "eth_getBlockReceipts",
        ["latest"],
        [*R11, {**chain_receipts(12)[0], "transactionIndex": "0x1"}],
        "[1]: a receipt of block 12, not of block 11",
    ),
    (
        "eth_getBlockReceipts",
        ["0xb"],
        [{**R11[0], "transactionIndex": "0x3"}],
        "transactionIndex 3",
    ),
    (
        "eth_getBlockReceipts",
        ["0xb"],
        edited(R11, lambda r: r[0]["logs"][0].update(blockNumber="0xc")),
        "[0].logs[0]: blockNumber 12, not 11",
    ),
    (
        "eth_getBlockReceipts",
        ["0xb"],
        edited(R11, lambda r: r[0]["logs"][0].update(transactionHash=OTHER)),
        f"[0].logs[0]: transactionHash {OTHER}",
    ),
    ("eth_getBlockReceipts", ["0xb"], {"0": R11[0]}, "eth_getBlockReceipts(0xb): not a list"),
    (
        "eth_getTransactionReceipt",
        [OTHER],
        R11[0],
        f"eth_getTransactionReceipt({OTHER}): transactionHash {tx_hash(11)}, not {OTHER}",
    ),
    ("eth_getTransactionByHash", [OTHER], B11["transactions"][0], f"hash {tx_hash(11)}"),
    (
        "eth_getLogs",
        [RANGE],
        [{**LOG, "blockNumber": "0x1f4"}],
        "[0]: a log of block 500, outside blocks 10..12",
    ),
    ("eth_getLogs", [RANGE], [{**LOG, "address": "0x" + "11" * 20}], "not one asked for"),
    ("eth_getLogs", [RANGE], [{**LOG, "topics": [OTHER]}], "topic 0 is"),
    ("eth_getLogs", [{"blockHash": OTHER}], [LOG], f"blockHash {block_hash(11)}, not {OTHER}"),
    ("eth_getLogs", [RANGE], {"logs": []}, "eth_getLogs"),
    ("eth_blockNumber", [], "0xzz", "eth_blockNumber: not a quantity (0x and 1 to 64 hex digits)"),
    ("eth_blockNumber", [], "0x" + "f" * 4000, "(4002 characters)"),
    ("eth_blockNumber", [], "0x" + "f" * 16, "is above 9223372036854775807"),
    ("eth_blockNumber", [], 16, "not a quantity"),
    ("eth_blockNumber", [], None, "not a quantity"),
    ("eth_getBalance", [TOKEN, "latest"], "0x" + "f" * 65, "not a quantity"),
    ("eth_call", [{"to": TOKEN, "data": "0x"}, "latest"], "0x1", "not 0x hex of whole bytes"),
]


@pytest.mark.parametrize(("method", "params", "answer", "words"), REFUSED)
def test_answers_that_are_not_what_was_asked_for_are_refused_in_one_line(
    method: str, params: list[Any], answer: Any, words: str
) -> None:
    with pytest.raises(RpcError) as caught:
        check_answer(method, params, answer)
    assert caught.value.kind is RpcErrorKind.BAD_ANSWER
    assert not caught.value.retryable
    assert words in caught.value.message
    assert "\n" not in caught.value.message
    assert len(caught.value.message) < 400


def receipts_of(hashes: list[str]) -> list[dict[str, Any]]:
    return [
        {**R11[0], "transactionHash": h, "transactionIndex": hex(i), "logs": []}
        for i, h in enumerate(hashes)
    ]


def test_receipts_are_of_the_blocks_transactions_in_order() -> None:
    hashes = [tx_hash(11), OTHER]
    receipts = receipts_of(hashes)
    assert check_receipts(receipts, "receipts", transactions=hashes) is receipts
    with pytest.raises(RpcError, match=f"transactionHash {OTHER}, not {tx_hash(11)}"):
        check_receipts(receipts_of(hashes[::-1]), "receipts", transactions=hashes)
    with pytest.raises(RpcError, match="2 receipts for a block of 1 transactions"):
        check_receipts(receipts, "receipts", transactions=hashes[:1])
