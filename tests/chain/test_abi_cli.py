"""``blockx chain abi`` as a real subprocess on a SQLite block database: add from a
file and from signatures, list, remove; a malformed ABI file or signature is one
line and exit 2, and leaves the registry as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

PAIR = "0x" + "ab" * 20


def abi_cli(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("blockx")
    assert binary is not None
    env = {k: v for k, v in os.environ.items() if k != "BLOCKDB_URL"}
    return subprocess.run(
        [binary, "chain", "abi", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, words: str) -> None:
    assert result.returncode == code, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert words in lines[0]


def test_add_list_and_remove_and_malformed_input_is_one_line(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/chain.db"
    erc20 = tmp_path / "erc20.json"
    erc20.write_text(
        json.dumps(
            {
                "abi": [
                    {
                        "type": "event",
                        "name": "Transfer",
                        "inputs": [
                            {"name": "from", "type": "address", "indexed": True},
                            {"name": "to", "type": "address", "indexed": True},
                            {"name": "value", "type": "uint256"},
                        ],
                    },
                    {"type": "error", "name": "Nope", "inputs": []},
                ]
            }
        )
    )
    added = abi_cli("add", "erc20", "--file", str(erc20), "--db", db)
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == "registered ABI erc20: 1 events, 0 functions, for any contract"
    swap = "event Swap(address indexed sender, uint amount0In, (uint8 a, string b)[] items)"

    bad = tmp_path / "bad.json"
    bad.write_text('[{"type": "event", "name": "X", "inputs": [{"type": "uint7"}]}]')
    assert_one_line(
        abi_cli("add", "bad", "--file", str(bad), "--db", db),
        2,
        f"{bad} entry 0 (X) inputs[0]: 'uint7' is no ABI type",
    )
    assert_one_line(
        abi_cli("add", "pair", "--signature", "event Swap(address indexed, uint", "--db", db),
        2,
        "signature 'event Swap(address indexed, uint'",
    )

    added = abi_cli("add", "pair", "--signature", swap, "--address", PAIR, "--db", db, "--json")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["addresses"] == [PAIR]
    listed = abi_cli("list", "--db", db, "--json")
    assert json.loads(listed.stdout) == [
        {
            "name": "erc20",
            "addresses": [],
            "entries": ["event Transfer(address indexed from, address indexed to, uint256 value)"],
        },
        {
            "name": "pair",
            "addresses": [PAIR],
            "entries": [
                "event Swap(address indexed sender, uint256 amount0In, (uint8,string)[] items)"
            ],
        },
    ]
    removed = abi_cli("remove", "erc20", "--db", db)
    assert removed.returncode == 0, removed.stderr
    assert_one_line(abi_cli("remove", "erc20", "--db", db), 1, "no ABI named 'erc20'")
