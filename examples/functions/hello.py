"""Example functions for the BlockX demo and the end-to-end tests."""

from blockx_executor import call, io


def hello_world(name):
    return f"hello, {name}"


async def greet_account(address):
    """Reads a balance from the Worker's memory backend and formats it in a sub-call."""
    balance = await io.memory.get(f"balance:{address}", 0)
    return {"address": address, "balance": await call("format_eth", balance)}


def format_eth(wei):
    return f"{wei / 10**18:.4f} ETH"
