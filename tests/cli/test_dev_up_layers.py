"""dev.toml and the layout of what ``dev up`` serves: flag > environment > file > default."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import free_port

from blockx_cli.devcluster.layout import find_layout
from blockx_cli.devcluster.processes import LaunchError
from blockx_cli.settings import DEFAULT_ETCD, Settings
from blockx_client import Client, ConnectError, InvalidRequestError, Registry
from blockx_client._options import proxy_socket_of
from blockx_client.dev_config import (
    DEV_VARIABLES,
    DevUpRunning,
    LayeredEnviron,
    claim_dev_config,
    dev_config_path,
    dev_lock_path,
    read_dev_config,
    remove_dev_config,
    write_dev_config,
)
from blockx_client.setting import Origin, Setting

VALUES = {
    "ETCD_ENDPOINTS": "127.0.0.1:41001",
    "BLOCKX_COORDINATOR": "127.0.0.1:41002",
    "BLOCKX_SYNC_INVOKER": "127.0.0.1:41003",
}


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in DEV_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "xdg"


PATHS = [
    # (environment, the file's path)
    ({"XDG_CONFIG_HOME": "/x", "HOME": "/h"}, Path("/x/blockx/dev.toml")),
    ({"XDG_CONFIG_HOME": " ", "HOME": "/h"}, Path("/h/.config/blockx/dev.toml")),
    ({"HOME": "/h"}, Path("/h/.config/blockx/dev.toml")),
]


@pytest.mark.parametrize(("environ", "path"), PATHS)
def test_the_file_follows_xdg_config_home(environ: dict[str, str], path: Path) -> None:
    assert dev_config_path(environ) == path


def test_written_values_read_back(config_home: Path) -> None:
    odd = {**VALUES, "BLOCKX_BUNDLE_COORDINATOR": 'host "quoted" \\ é:1'}
    path = write_dev_config(odd)
    assert path == config_home / "blockx" / "dev.toml"
    assert read_dev_config() == odd
    remove_dev_config()
    assert not path.exists()
    assert read_dev_config() == {}


def _left_by_a_dead_dev_up() -> Path:
    """dev.toml as a dev up killed outright leaves it: its writer pid is gone."""
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    path = write_dev_config(VALUES)
    path.write_text(path.read_text().replace(f"pid = {os.getpid()}", f"pid = {gone.stdout}"))
    return path


def test_a_file_whose_writer_is_gone_is_ignored(config_home: Path) -> None:
    path = _left_by_a_dead_dev_up()
    assert read_dev_config() == {}
    remove_dev_config()  # not this process's: left alone
    assert path.exists()


def test_a_file_that_is_not_toml_is_an_error_naming_it(config_home: Path) -> None:
    path = config_home / "blockx" / "dev.toml"
    path.parent.mkdir(parents=True)
    path.write_text("ETCD_ENDPOINTS = \n")
    with pytest.raises(InvalidRequestError, match=str(path)):
        read_dev_config()


def test_the_environment_wins_over_the_file() -> None:
    layered = LayeredEnviron({"BLOCKX_COORDINATOR": "env:1", "ETCD_ENDPOINTS": " "}, VALUES)
    assert layered["BLOCKX_COORDINATOR"] == "env:1"
    assert layered["ETCD_ENDPOINTS"] == VALUES["ETCD_ENDPOINTS"]  # blank: unset
    assert "BLOCKX_BUNDLE_COORDINATOR" not in layered


def test_client_arguments_environment_file_defaults(
    config_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Client().coordinator == "127.0.0.1:8080"  # no file: the default
    write_dev_config(VALUES)
    try:
        assert Client().coordinator == VALUES["BLOCKX_COORDINATOR"]
        assert Client().sync_invoker == VALUES["BLOCKX_SYNC_INVOKER"]
        monkeypatch.setenv("BLOCKX_COORDINATOR", "env:1")
        assert Client().coordinator == "env:1"
        assert Client(coordinator="arg:1").coordinator == "arg:1"
    finally:
        remove_dev_config()


def test_cli_etcd_flag_or_environment_file_default(config_home: Path) -> None:
    def settings(etcd: str | None) -> Settings:
        return Settings(None, None, None, None, etcd)

    assert settings(None).etcd == DEFAULT_ETCD
    write_dev_config(VALUES)
    try:
        assert settings(None).etcd == VALUES["ETCD_ENDPOINTS"]
        # typer hands over the flag, or ETCD_ENDPOINTS when there is no flag.
        assert settings("given:2379").etcd_endpoints() == ["given:2379"]
    finally:
        remove_dev_config()


SETTINGS = [
    # (given, environment, dev.toml, the setting's value, origin, dev.toml's value)
    ("arg:1", {"BLOCKX_COORDINATOR": "env:1"}, {"BLOCKX_COORDINATOR": "dev:1"}, "arg:1",
     Origin.GIVEN, "dev:1"),
    (None, {"BLOCKX_COORDINATOR": " env:1 "}, {"BLOCKX_COORDINATOR": "dev:1"}, "env:1",
     Origin.ENVIRONMENT, "dev:1"),
    (" ", {"BLOCKX_COORDINATOR": " "}, {"BLOCKX_COORDINATOR": "dev:1"}, "dev:1",
     Origin.DEV_CONFIG, "dev:1"),
    (None, {}, {}, "default:1", Origin.DEFAULT, None),
]  # fmt: skip


@pytest.mark.parametrize(("given", "environ", "file", "value", "origin", "dev"), SETTINGS)
def test_each_setting_knows_where_it_came_from(
    given: str | None,
    environ: dict[str, str],
    file: dict[str, str],
    value: str,
    origin: Origin,
    dev: str | None,
) -> None:
    found = LayeredEnviron(environ, file).setting("BLOCKX_COORDINATOR", given, "default:1")
    assert found == Setting(
        variable="BLOCKX_COORDINATOR", value=value, origin=origin, dev_value=dev
    )


ORIGIN_TEXTS = [
    # (origin, dev.toml's value, how it was given, the words)
    (Origin.ENVIRONMENT, "127.0.0.1:2", None,
     "ETCD_ENDPOINTS from the environment; dev.toml says 127.0.0.1:2 — unset ETCD_ENDPOINTS?"),
    (Origin.ENVIRONMENT, "127.0.0.1:1", None, "ETCD_ENDPOINTS from the environment"),
    (Origin.ENVIRONMENT, None, None, "ETCD_ENDPOINTS from the environment"),
    (Origin.GIVEN, "127.0.0.1:2", "--etcd",
     "from --etcd; dev.toml says 127.0.0.1:2 — leave --etcd out?"),
    (Origin.GIVEN, None, None, None),  # the caller named it and knows
    (Origin.DEV_CONFIG, "127.0.0.1:1", None,
     "ETCD_ENDPOINTS from the running `blockx dev up`'s dev.toml"),
    (Origin.DEFAULT, None, None,
     "the default: no ETCD_ENDPOINTS set and no `blockx dev up` running"),
]  # fmt: skip


@pytest.mark.parametrize(("origin", "dev", "given_as", "words"), ORIGIN_TEXTS)
def test_an_origin_in_words(
    origin: Origin, dev: str | None, given_as: str | None, words: str | None
) -> None:
    setting = Setting(variable="ETCD_ENDPOINTS", value="127.0.0.1:1", origin=origin, dev_value=dev)
    assert setting.origin_text(given_as) == words


def test_the_exports_that_hide_dev_toml_are_named() -> None:
    environ = {"ETCD_ENDPOINTS": "old:1", "BLOCKX_COORDINATOR": "same:2", "PROXY_SOCKET_PATH": " "}
    file = {"ETCD_ENDPOINTS": "new:1", "BLOCKX_COORDINATOR": "same:2", "PROXY_SOCKET_PATH": "/p"}
    assert LayeredEnviron(environ, file).overridden() == ["ETCD_ENDPOINTS"]


async def test_a_stale_export_is_named_when_the_client_cannot_connect(
    config_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BLOCKX_COORDINATOR left from an earlier dev up, dev.toml naming the running
    one's: the error says which won and what to do."""
    stale, running = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    write_dev_config({"BLOCKX_COORDINATOR": running, "ETCD_ENDPOINTS": "127.0.0.1:1"})
    monkeypatch.setenv("BLOCKX_COORDINATOR", stale)
    try:
        async with Client(direct=True) as client:
            with pytest.raises(ConnectError) as failed:
                await client.reserve_worker_slot(deadline_s=0.2)
        assert failed.value.message.endswith(
            f"(BLOCKX_COORDINATOR from the environment; dev.toml says {running} — "
            "unset BLOCKX_COORDINATOR?))"
        )
        assert failed.value.setting is not None
        assert failed.value.setting.origin is Origin.ENVIRONMENT
        # The registry of list_tasks reads dev.toml too, and says so.
        registry = Registry.from_environ()
        assert registry.endpoints == ("127.0.0.1:1",)
        assert registry.setting is not None
        assert registry.setting.origin is Origin.DEV_CONFIG
    finally:
        remove_dev_config()


def test_one_dev_up_holds_the_file_and_a_stale_one_is_replaced(config_home: Path) -> None:
    stale = _left_by_a_dead_dev_up()  # its lock died with it
    with claim_dev_config() as path:
        assert path == stale
        assert dev_lock_path().read_text() == f"{os.getpid()}\n"
        # The lock is per open file: a second claim, even from this process, is refused.
        with pytest.raises(DevUpRunning) as refused, claim_dev_config():
            pass
        assert refused.value.pid == os.getpid()
        assert str(refused.value) == (
            f"another blockx dev up is running (pid {os.getpid()}), holding {dev_lock_path()}; "
            f"stop it first: Ctrl-C in its terminal, or kill -INT {os.getpid()}"
        )
        write_dev_config({**VALUES, "PROXY_SOCKET_PATH": "/run/p.sock"}, path)
        assert read_dev_config()["PROXY_SOCKET_PATH"] == "/run/p.sock"
        remove_dev_config(path)
        assert not path.exists()
    with claim_dev_config():  # released at the end of the block
        pass


PROXY = "/run/dev/proxy.sock"
PROXY_ROUTES = [
    # (Client arguments, the environment, dev.toml, the proxy used: None = direct)
    ({}, {}, {}, None),
    ({}, {}, {"PROXY_SOCKET_PATH": PROXY, **VALUES}, PROXY),
    ({}, {"PROXY_SOCKET_PATH": " "}, {"PROXY_SOCKET_PATH": PROXY}, PROXY),
    ({"direct": True}, {}, {"PROXY_SOCKET_PATH": PROXY}, None),
    ({"direct": True}, {"PROXY_SOCKET_PATH": "/env.sock"}, {}, None),
    ({"proxy_socket": "/arg.sock"}, {"PROXY_SOCKET_PATH": "/env.sock"}, {}, "/arg.sock"),
    ({}, {"PROXY_SOCKET_PATH": "/env.sock"}, {"PROXY_SOCKET_PATH": PROXY}, "/env.sock"),
    # An address named above dev.toml is another cluster: dev up's proxy would not reach it.
    ({"coordinator": "10.0.0.1:8080"}, {}, {"PROXY_SOCKET_PATH": PROXY}, None),
    ({}, {"BLOCKX_SYNC_INVOKER": "10.0.0.1:9091"}, {"PROXY_SOCKET_PATH": PROXY}, None),
    ({}, {"BLOCKX_COORDINATOR": " "}, {"PROXY_SOCKET_PATH": PROXY}, PROXY),
    # ...but a proxy named above dev.toml is used whatever the addresses.
    ({"coordinator": "10.0.0.1:8080"}, {"PROXY_SOCKET_PATH": "/env.sock"}, {}, "/env.sock"),
]


@pytest.mark.parametrize(("arguments", "environ", "file", "used"), PROXY_ROUTES)
def test_the_proxy_is_used_unless_told_or_named_otherwise(
    arguments: dict[str, Any], environ: dict[str, str], file: dict[str, str], used: str | None
) -> None:
    addresses = [arguments.get(k) for k in ("coordinator", "bundle_coordinator", "sync_invoker")]
    found = proxy_socket_of(
        LayeredEnviron(environ, file),
        arguments.get("proxy_socket"),
        direct=arguments.get("direct", False),
        addresses=addresses,
    )
    assert found == used


def test_direct_and_a_proxy_argument_contradict() -> None:
    with pytest.raises(InvalidRequestError, match="contradict"):
        proxy_socket_of(LayeredEnviron({}, {}), "/p.sock", direct=True, addresses=())


def test_client_and_cli_go_through_dev_ups_proxy(
    config_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_dev_config({**VALUES, "PROXY_SOCKET_PATH": PROXY})
    try:
        assert Client().proxy_socket == PROXY
        assert Client(direct=True).proxy_socket is None
        assert Settings(None, None, None, None, None).client().proxy_socket == PROXY
        # --direct wins over --proxy / PROXY_SOCKET_PATH too.
        assert Settings(None, None, None, "/p", None, direct=True).client().proxy_socket is None
        monkeypatch.setenv("BLOCKX_COORDINATOR", "10.0.0.1:8080")
        assert Client().proxy_socket is None
    finally:
        remove_dev_config()


def _functions(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "f.py").write_text("def f():\n    return 1\n")
    return folder


def test_layout_flag_then_environment_then_examples(tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    _functions(examples / "functions")
    (examples / "tasks").mkdir()
    (examples / "tasks" / "hello_world.json").write_text("{}")
    (examples / "memory_seed.json").write_text("{}")
    mine = _functions(tmp_path / "mine")
    env_dir = _functions(tmp_path / "from_env")

    served = find_layout(examples=examples, environ={})
    assert served.functions_dir == (examples / "functions").resolve()
    assert served.smoke_task == (examples / "tasks" / "hello_world.json").resolve()
    assert served.memory_seed == (examples / "memory_seed.json").resolve()

    from_env = find_layout(examples=examples, environ={"FUNCTIONS_DIR": str(env_dir)})
    assert from_env.functions_dir == env_dir.resolve()
    assert from_env.smoke_task is None  # it calls the example functions, not these

    flagged = find_layout(
        functions=mine, examples=examples, environ={"FUNCTIONS_DIR": str(env_dir)}
    )
    assert flagged.functions_dir == mine.resolve()

    alone = find_layout(functions=mine, examples=tmp_path / "none", environ={})
    assert alone == type(alone)(functions_dir=mine.resolve())


LAYOUT_ERRORS = [
    # (functions flag, FUNCTIONS_DIR, examples, the message's start)
    (None, None, "none", "no functions to serve: "),
    ("missing", None, None, "--functions "),
    (None, "missing", None, "FUNCTIONS_DIR="),
]


@pytest.mark.parametrize(("flag", "env", "examples", "start"), LAYOUT_ERRORS)
def test_layout_errors_say_what_is_missing(
    tmp_path: Path, flag: str | None, env: str | None, examples: str | None, start: str
) -> None:
    with pytest.raises(LaunchError) as err:
        find_layout(
            functions=tmp_path / flag if flag else None,
            examples=tmp_path / examples if examples else tmp_path,
            environ={"FUNCTIONS_DIR": str(tmp_path / env)} if env else {},
        )
    assert str(err.value).startswith(start)


@pytest.mark.parametrize(
    ("program", "package"), [("blockx-dev", "blockx-cli"), ("blockx-chain-devnet", "blockx-chain")]
)
def test_dev_programs_answer_version(program: str, package: str) -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / program), "--version"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{program} {importlib.metadata.version(package)}\n"
