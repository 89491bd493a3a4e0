"""``io.iceberg`` on a real SQL catalog (SQLite, local warehouse): a task's reads
of a table see one snapshot, pinned reads are cached, the read bound, writes only
from a Writer's scope; its settings and the ``[iceberg]`` section of --config."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from blockx_chain.lake import LakeConfig, LakeStore
from blockx_core.failures import IoErrorKind
from blockx_server.io.backends.iceberg import IcebergBackend
from blockx_server.io.config import read_iceberg_settings
from blockx_server.io.errors import IoFailed, IoOk, IoOutcome, IoReason
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.runtime.config_file import ConfigFileError, read_config_file
from blockx_server.runtime.env import ConfigErrors, ConfigReader, EnvironSource


@pytest_asyncio.fixture
async def lake(tmp_path: Path) -> AsyncIterator[tuple[IcebergBackend, LakeStore]]:
    config = LakeConfig(
        uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=str(tmp_path / "wh"), max_rows=4
    )
    backend = IcebergBackend(config)
    await backend.start()
    writer = await LakeStore.open(config)
    await writer.replace_blocks("t", 1, [(1, "0xa", [{"v": 1}]), (2, "0xb", [{"v": 2}])])
    yield backend, writer
    await writer.close()
    await backend.close()


def _rows(outcome: IoOutcome) -> list[Any]:
    assert isinstance(outcome, IoOk), outcome
    rows: list[Any] = json.loads(outcome.value_json)["rows"]
    return sorted(row["v"] for row in rows)


async def test_a_task_reads_one_snapshot_and_pinned_reads_are_cached(
    lake: tuple[IcebergBackend, LakeStore],
) -> None:
    backend, writer = lake
    router = IoRouter([backend])
    task = TaskIoScope(router, "task-1")
    assert _rows(await task.request("iceberg", "scan", ["t"])) == [1, 2]
    await writer.replace_blocks("t", 1, [(3, "0xc", [{"v": 3}])])
    # The same task, another read of the table: the first read's snapshot.
    again = await task.request("iceberg", "scan", ["t"], {"row_filter": "v >= 2"})
    assert _rows(again) == [2]
    repeat = await task.request("iceberg", "scan", ["t"], {"row_filter": "v >= 2"})
    assert isinstance(repeat, IoOk)
    assert repeat.cached
    # Another task pins the newest snapshot.
    other = TaskIoScope(router, "task-2")
    assert _rows(await other.request("iceberg", "scan", ["t"])) == [1, 2, 3]
    # A task's writer scope shares its pins.
    assert _rows(await task.writer().request("iceberg", "scan", ["t"])) == [1, 2]


async def test_reads_are_bounded_and_writes_need_a_writer(
    lake: tuple[IcebergBackend, LakeStore],
) -> None:
    backend, writer = lake
    await writer.replace_blocks("t", 1, [(n, "0xa", [{"v": n}]) for n in range(3, 8)])
    router = IoRouter([backend])
    task = TaskIoScope(router, "task-1")
    wide = await task.request("iceberg", "scan", ["t"])
    assert isinstance(wide, IoFailed)
    assert wide.kind is IoErrorKind.BAD_REQUEST
    assert wide.reason is IoReason.TOO_MANY_ROWS
    assert "narrow" in wide.message
    missing = await task.request("iceberg", "scan", ["nope"])
    assert isinstance(missing, IoFailed)
    assert "no table 'nope'" in missing.message
    blocks = [[9, "0x9", [{"v": 9}]]]
    refused = await task.request("iceberg", "replace_blocks", ["t", 1, blocks])
    assert isinstance(refused, IoFailed)
    assert refused.kind is IoErrorKind.WRITE_FORBIDDEN
    written = await task.writer().request("iceberg", "replace_blocks", ["t", 1, blocks])
    assert isinstance(written, IoOk)
    assert json.loads(written.value_json)["blocks"] == 1


def _read(environ: dict[str, str]) -> LakeConfig | None:
    reader = ConfigReader(EnvironSource(environ))
    config = read_iceberg_settings(reader)
    reader.finish()
    return config


def test_settings_name_the_variable_of_a_bad_value(tmp_path: Path) -> None:
    assert _read({}) is None
    uri = f"sqlite:///{tmp_path}/c.db"
    config = _read({"ICEBERG_CATALOG_URI": uri, "ICEBERG_WAREHOUSE": str(tmp_path)})
    assert config is not None
    assert config.namespace == "blockx"
    cases = [
        ({"ICEBERG_CATALOG_URI": uri}, "ICEBERG_WAREHOUSE must be set"),
        ({"ICEBERG_CATALOG_URI": "mysql://x/y", "ICEBERG_WAREHOUSE": "w"}, "ICEBERG_CATALOG_URI"),
        ({"ICEBERG_CATALOG_URI": uri, "ICEBERG_CATALOG_TYPE": "nessie"}, "ICEBERG_CATALOG_TYPE"),
        (
            {"ICEBERG_CATALOG_URI": "http://h/", "ICEBERG_CATALOG_TYPE": "rest"},
            "ICEBERG_LEDGER_URL",
        ),
        ({"ICEBERG_CATALOG_URI": uri, "ICEBERG_CATALOG_PROPERTIES": "[1]"}, "PROPERTIES must"),
        ({"ICEBERG_CATALOG_URI": uri, "ICEBERG_NAMESPACE": "a.b"}, "ICEBERG_NAMESPACE"),
        ({"ICEBERG_CATALOG_URI": uri, "ICEBERG_MAX_ROWS": "0"}, "ICEBERG_MAX_ROWS must be >= 1"),
    ]
    for environ, said in cases:
        with pytest.raises(ConfigErrors) as refused:
            _read(environ)
        assert said in str(refused.value), (environ, str(refused.value))


def test_the_iceberg_section_of_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "blockx.toml"
    path.write_text(
        '[iceberg]\ncatalog_uri = "sqlite:///c.db"\nmax_rows = 10\n'
        '[iceberg.catalog_properties]\n"s3.endpoint" = "http://minio:9000"\n'
    )
    known = ["ICEBERG_CATALOG_URI", "ICEBERG_MAX_ROWS", "ICEBERG_CATALOG_PROPERTIES"]
    assert read_config_file(path, known) == {
        "ICEBERG_CATALOG_URI": "sqlite:///c.db",
        "ICEBERG_MAX_ROWS": "10",
        "ICEBERG_CATALOG_PROPERTIES": '{"s3.endpoint":"http://minio:9000"}',
    }
    path.write_text('[iceberg]\ncatalog_url = "x"\n')
    with pytest.raises(ConfigFileError, match=r"\[iceberg\] unknown key catalog_url.*catalog_uri"):
        read_config_file(path, known)


def test_a_worker_with_a_bad_lake_configuration_refuses_to_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "blockx-worker")],
        env={"ICEBERG_CATALOG_URI": f"sqlite:///{tmp_path}/c.db", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert any("ICEBERG_WAREHOUSE" in line for line in done.stderr.splitlines())
