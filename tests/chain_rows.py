"""Block database rows made up for tests, written through the store's write API."""

from __future__ import annotations

from blockx_chain.schema import TRANSFER_TOPIC, Block, BlockRows, Log, Transaction
from blockx_chain.store import BlockStore, open_store
from blockx_chain.url import parse_blockdb_url

GENESIS = "0x" + "00" * 31 + "01"
# The chain id of every block database these helpers make.
CHAIN_ID = 31337
TOKEN = "0x" + "aa" * 20
OTHER_TOPIC = "0x" + "ee" * 32


def h32(*parts: int) -> str:
    return "0x" + "".join(f"{p:08x}" for p in parts).rjust(64, "0")


def address(n: int) -> str:
    return "0x" + f"{n:040x}"


def block_hash(number: int, branch: int = 0) -> str:
    return h32(0xB10C, branch, number)


def make_block(number: int, *, txs: int = 2, branch: int = 0) -> BlockRows:
    """Block ``number`` with ``txs`` transactions; each has one ERC-20 Transfer log and
    one other log (so a block has ``2 * txs`` logs and ``txs`` transfers)."""
    hash_ = block_hash(number, branch)
    parent = block_hash(number - 1, branch) if number > 0 else "0x" + "00" * 32
    transactions = []
    logs = []
    for i in range(txs):
        tx_hash = h32(0x7A, branch, number, i)
        transactions.append(
            Transaction(
                block_number=number,
                transaction_index=i,
                transaction_hash=tx_hash,
                block_hash=hash_,
                from_address=address(1 + i),
                to_address=TOKEN if i % 2 == 0 else None,
                value=str(10**30 + number * 1000 + i),
                input="0x" if i % 2 else "0xa9059cbb",
                nonce=number,
                gas_limit=60_000,
                gas_used=51_000 + i,
                effective_gas_price=1_000_000_007,
                transaction_type=2,
                success=1 if i % 3 else 0,
                contract_address=None if i % 2 == 0 else address(0xC0 + i),
            )
        )
        logs.append(
            Log(
                block_number=number,
                log_index=2 * i,
                transaction_index=i,
                transaction_hash=tx_hash,
                block_hash=hash_,
                address=TOKEN,
                topic0=TRANSFER_TOPIC,
                topic1="0x" + "00" * 12 + address(1 + i)[2:],
                topic2="0x" + "00" * 12 + address(100 + i)[2:],
                topic3=None,
                data="0x" + f"{2**200 + number:064x}",
            )
        )
        logs.append(
            Log(
                block_number=number,
                log_index=2 * i + 1,
                transaction_index=i,
                transaction_hash=tx_hash,
                block_hash=hash_,
                address=address(0xDD),
                topic0=OTHER_TOPIC,
                topic1=None,
                topic2=None,
                topic3=None,
                data="0x",
            )
        )
    block = Block(
        block_number=number,
        block_hash=hash_,
        parent_hash=parent,
        timestamp=1_700_000_000 + 12 * number,
        miner=address(0xBEEF),
        gas_used=sum(t.gas_used for t in transactions),
        gas_limit=30_000_000,
        base_fee_per_gas=None if number == 0 else 7 + number,
        transaction_count=txs,
    )
    return BlockRows(block=block, transactions=transactions, logs=logs)


async def seed_chain(url: str, count: int) -> None:
    """A block database at ``url`` holding blocks 0..count-1 (``make_block``), the
    last one the head and the one four below it finalized."""
    store = await open_store(parse_blockdb_url(url))
    try:
        async with store.writer() as w:
            await w.init_chain(CHAIN_ID, GENESIS)
            await w.insert_blocks([make_block(n) for n in range(count)])
            last = count - 1
            await w.set_chain(
                head_number=last, head_hash=block_hash(last), finalized_number=last - 4, epoch=0
            )
    finally:
        await store.close()


async def shorten_chain(
    store: BlockStore, *, fork: int, depth: int, old_head_hash: str
) -> BlockRows:
    """A reorg the way ingest applies one, in one transaction: the blocks above
    ``fork`` dropped, the reorg (of ``depth`` blocks) recorded, and a new branch
    of one block written as the head (``make_block`` on branch 9), which it returns."""
    new_block = make_block(fork + 1, branch=9)
    chain = await store.chain()
    assert chain is not None
    async with store.writer() as w:
        await w.delete_above(fork)
        await w.record_reorg(
            detected_at_ms=0,
            fork_block_number=fork,
            depth=depth,
            old_head_hash=old_head_hash,
            new_head_hash=new_block.block.block_hash,
        )
        await w.insert_blocks([new_block])
        await w.set_chain(
            head_number=fork + 1,
            head_hash=new_block.block.block_hash,
            finalized_number=chain.finalized_number,
            epoch=chain.epoch,
        )
    return new_block
