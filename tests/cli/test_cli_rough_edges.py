"""Rough edges a newcomer hits in ``blockx``: a malformed address is a usage error,
``--help`` shows every default, ``workers`` names its fractions for what they are.

The CLI runs as a real subprocess (the installed ``blockx`` script), against a
real local cluster where a command needs one."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from support import dead_addr
from typer.testing import CliRunner

from blockx_cli.addresses import dial_address, etcd_endpoint, unix_socket_path
from blockx_cli.app import app
from blockx_cli.devcluster import LocalCluster
from blockx_client.dev_config import dev_config_path, write_dev_config
from blockx_core.addr import InvalidAddress

ROOT = Path(__file__).resolve().parents[2]


def blockx(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("blockx")
    assert binary is not None
    return subprocess.run(
        [binary, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


# ---- a malformed address is a usage error (exit 2), one line, before any RPC -------

BAD_ADDRESSES = [
    # (arguments, environment, the option or variable named, words of the reason)
    (
        ["--coordinator", "nonsense", "reserve", "--timeout", "1"],
        {},
        "--coordinator",
        "not host:port",
    ),
    (["--coordinator", "127.0.0.1:99999", "reserve"], {}, "--coordinator", "no valid port"),
    (["--coordinator", "::1:8080", "reserve"], {}, "--coordinator", "IPv6 host in brackets"),
    (["reserve"], {"BLOCKX_COORDINATOR": "nonsense"}, "BLOCKX_COORDINATOR", "not host:port"),
    (["--bundle-coordinator", "x:y", "reserve"], {}, "--bundle-coordinator", "no valid port"),
    (["--sync-invoker", "localhost", "invoke", "f"], {}, "--sync-invoker", "not host:port"),
    (["get-result", "t", "--worker", "nonsense"], {}, "--worker", "not host:port"),
    (["watch", "t", "--worker", "127.0.0.1:0"], {}, "--worker", "port 0"),
    (
        ["submit", "--function", "f", "--call", "[1]", "--worker", ":9090"],
        {},
        "--worker",
        "no host",
    ),
    (["--etcd", "localhost:2379,:x", "workers"], {}, "--etcd", "no host"),
    (["workers"], {"ETCD_ENDPOINTS": " , "}, "ETCD_ENDPOINTS", "names no etcd endpoint"),
    (["--proxy", "unix:", "invoke", "f"], {}, "--proxy", "names no socket path"),
    (["--etcd", "[", "workers"], {}, "--etcd", "no valid host"),
    (["--coordinator", "a b:1", "reserve"], {}, "--coordinator", "no valid host"),
]


@pytest.mark.parametrize(("args", "env", "named", "reason"), BAD_ADDRESSES)
def test_a_malformed_address_is_a_usage_error(
    args: list[str], env: dict[str, str], named: str, reason: str
) -> None:
    result = blockx(*args, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    first, *rest = result.stderr.strip().splitlines()
    assert first.startswith(f"error: {named}: "), result.stderr
    assert reason in first
    assert all(line.startswith("hint: ") for line in rest), result.stderr
    assert "Traceback" not in result.stdout + result.stderr


BAD_TASK_IDS = [
    # (arguments, the error line, the hint)
    (["watch", "t-1", ""], "error: a task id is empty", None),
    (["get-result", "x" * 300], "error: task_id is 300 bytes long; at most 256", None),
    (
        ["reserve", "--task-id", ""],
        "error: --task-id is empty",
        "hint: leave --task-id out to have one generated",
    ),
]


@pytest.mark.parametrize(("args", "error", "hint"), BAD_TASK_IDS)
def test_a_task_id_no_worker_accepts_is_a_usage_error(
    args: list[str], error: str, hint: str | None
) -> None:
    """Refused before any RPC: no cluster runs here, so reaching for one exits 3."""
    result = blockx("--coordinator", "127.0.0.1:1", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(error), result.stderr
    assert lines[1:] == ([hint] if hint else [])


ADDRESS_FORMS = [
    # (parse, written, read as)
    (dial_address, "127.0.0.1:8080", "127.0.0.1:8080"),
    (dial_address, " [::1]:8080 ", "[::1]:8080"),
    (dial_address, "worker-3.internal:9090", "worker-3.internal:9090"),
    (etcd_endpoint, "localhost:2379", "localhost:2379"),
    (etcd_endpoint, "etcd-0", "etcd-0:2379"),  # a bare host: etcd's port, as the servers
    (etcd_endpoint, "http://127.0.0.1:2379/", "127.0.0.1:2379"),
    (etcd_endpoint, "https://[::1]", "[::1]:2379"),
    (unix_socket_path, "/run/blockx/proxy.sock", "/run/blockx/proxy.sock"),
    (unix_socket_path, "unix:/run/blockx/proxy.sock", "/run/blockx/proxy.sock"),
    (unix_socket_path, "unix:///run/blockx/proxy.sock", "/run/blockx/proxy.sock"),
]


@pytest.mark.parametrize(("parse", "written", "read_as"), ADDRESS_FORMS)
def test_each_address_form_is_read(parse: object, written: str, read_as: str) -> None:
    assert callable(parse)
    assert parse(written) == read_as


@pytest.mark.parametrize(
    ("parse", "written"),
    [
        (dial_address, "nonsense"),
        (dial_address, "host:0"),
        (dial_address, "host:port"),
        (etcd_endpoint, "a:b:c"),
        (etcd_endpoint, "localhost:70000"),
        (unix_socket_path, "unix://"),
    ],
)
def test_a_malformed_form_is_refused(parse: object, written: str) -> None:
    assert callable(parse)
    with pytest.raises(InvalidAddress):
        parse(written)


# ---- --help shows every default ------------------------------------------------------

HELP_DEFAULTS = {
    # command: {option: what its help line shows}
    "": {
        "--coordinator": "[default: (127.0.0.1:8080)]",
        "--sync-invoker": "[default: (127.0.0.1:9091)]",
        "--etcd": "[default: (the running dev up's, else localhost:2379)]",
    },
    "submit": {
        "--task-id": "[default: (a uuid4)]",
        "--handler": "[default: ReturnValueResultHandler]",
    },
    "reserve": {"--task-id": "[default: (a uuid4)]", "--timeout": "[default: 30.0]"},
    "workers": {"--prefix": "[default: (/blockx/workers/ and /blockx/bundle-workers/)]"},
    "follow": {"--from": "[default: (where the sink table's ledger left off, or the head)]"},
}


@pytest.mark.parametrize("command", sorted(HELP_DEFAULTS))
def test_help_shows_the_defaults(command: str) -> None:
    result = blockx(*command.split(), "--help")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for option, shown in HELP_DEFAULTS[command].items():
        text = _option_help(lines, option)
        assert shown in text, text


def _option_help(lines: list[str], option: str) -> str:
    """An option's help as one line: its row of the table and the rows continuing it."""
    start = next(i for i, line in enumerate(lines) if f" {option} " in line)
    rows = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("│") or re.match(r"│\s{1,4}[-*]", line):
            break
        rows.append(line)
    return " ".join(" ".join(row.strip("│").split()) for row in rows)


def test_the_etcd_help_names_every_command_that_reads_it() -> None:
    result = blockx("--help")
    assert result.returncode == 0, result.stderr
    text = _option_help(result.stdout.splitlines(), "--etcd")
    for command in ("workers", "tasks", "dashboard", "watch", "get-result", "cancel"):
        assert f"`{command}`" in text, text


# A rich markup tag: ``[word...]`` not escaped. Rich swallows it from help text.
_RICH_TAG = re.compile(r"(?<!\\)\[[A-Za-z#/@][^\[\]]*\]")


def _commands(command: object, path: str) -> Iterator[tuple[str, object]]:
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _commands(sub, f"{path} {name}")


def test_no_help_text_holds_a_bracket_rich_would_swallow() -> None:
    """A ``[default: ...]`` (or any ``[word]``) written into help text vanishes under
    rich markup; a described default belongs in ``show_default=``."""
    swallowed = []
    for path, command in _commands(typer.main.get_command(app), "blockx"):
        texts = [getattr(command, "help", None) or ""]
        texts += [getattr(p, "help", None) or "" for p in getattr(command, "params", [])]
        swallowed += [f"{path}: {m}" for text in texts for m in _RICH_TAG.findall(text)]
    assert swallowed == []


# ---- against a running cluster -------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    local = LocalCluster(ROOT / "examples", chain=False)
    try:
        yield local.wait_ready()
    finally:
        local.stop()


def test_workers_reports_fractions_named_as_fractions(cluster: dict[str, str]) -> None:
    result = blockx("--etcd", cluster["etcd"], "workers", "--json")
    assert result.returncode == 0, result.stderr
    [worker] = json.loads(result.stdout)
    assert worker["worker_addr"] == cluster["worker"]
    assert "cpu_percent" not in worker
    assert "memory_percent" not in worker
    for key in ("cpu_fraction", "memory_fraction", "error_rate"):
        assert 0.0 <= worker[key] <= 1.0, (key, worker[key])
    # The table shows them as percentages (the values move between two reads).
    _assert_percentages(blockx("--etcd", cluster["etcd"], "workers"), cluster["worker"])


def _assert_percentages(table: subprocess.CompletedProcess[str], worker: str) -> None:
    """The worker's cpu, mem and errors cells are percentages."""
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    head = next(line for line in lines if "worker" in line and "cpu" in line)
    row = next(line for line in lines if worker in line)
    cells = dict(zip(_cells(head), _cells(row), strict=True))
    for column in ("cpu", "mem", "errors"):
        assert re.fullmatch(r"\d{1,3}%", cells[column]), (column, cells)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("│┃").split("│" if "│" in line else "┃")]


def test_an_etcd_endpoint_with_a_scheme(cluster: dict[str, str]) -> None:
    """ETCD_ENDPOINTS as the servers take it: an http:// scheme and a trailing slash."""
    result = blockx("workers", "--json", env={"ETCD_ENDPOINTS": f"http://{cluster['etcd']}/"})
    assert result.returncode == 0, result.stderr
    assert [w["worker_addr"] for w in json.loads(result.stdout)] == [cluster["worker"]]


def test_the_proxy_socket_as_dev_up_prints_it(cluster: dict[str, str]) -> None:
    """``blockx dev up`` prints the proxy as ``unix:PATH``; --proxy takes that form."""
    result = blockx(
        "--proxy", f"unix:{cluster['proxy_socket']}", "invoke", "hello_world", "u", "--json"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["value"] == "hello, u"


def test_why_shows_cpu_as_workers_does(cluster: dict[str, str]) -> None:
    """The same heartbeat fractions, the same way: percentages in both tables."""
    why = blockx("--coordinator", cluster["coordinator"], "--direct", "why")
    _assert_percentages(why, cluster["worker"])


# ---- output on a narrow terminal and through a pipe ----------------------------------

LONG_NAME = "a-name-long-enough-to-pass-eighty-columns-" * 3
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def listed(cluster: dict[str, str]) -> dict[str, str]:
    """A task that succeeded and one that failed, for ``blockx tasks`` to list."""
    ids = {"ok": "narrow-ok-" + "x" * 26, "failed": "narrow-failed-" + "y" * 22}
    for kind, function in (("ok", "hello_world"), ("failed", "no_such_function")):
        result = blockx(
            "--coordinator", cluster["coordinator"], "--direct", "submit", "--function",
            function, "--call", "[1]", "--task-id", ids[kind], "--wait", "--json",
        )  # fmt: skip
        assert result.returncode in (0, 1), result.stderr
    return ids


@pytest.mark.parametrize("width", [80, 100, 200])
def test_tasks_fit_the_terminal(
    cluster: dict[str, str], listed: dict[str, str], width: int
) -> None:
    """No column is squeezed to nothing with an empty header: the table fits, each
    column shown has its header, the ones left out are named."""
    result = CliRunner().invoke(
        app,
        ["--etcd", cluster["etcd"], "tasks"],
        env={"COLUMNS": str(width), "TTY_COMPATIBLE": "1"},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    shown = _ANSI.sub("", result.stdout)
    lines = shown.splitlines()
    assert all(len(line) <= width for line in lines), shown
    header = next(line for line in lines if line.startswith("┃"))
    headers = _cells(header)
    assert all(headers), shown
    assert headers[:2] == ["task", "state"], shown
    assert "failure" in headers, shown
    row = next(line for line in lines if listed["failed"] in line)
    assert "FAILED" in row
    left_out = {"worker", "function", "calls", "age", "ended", "failure"} - set(headers)
    if width == 200:
        assert not left_out
    else:
        assert left_out, shown
        assert f"not shown at {width} columns: " in shown
        assert all(name in shown.split("not shown at", 1)[1] for name in left_out)


def test_piped_output_is_never_wrapped(cluster: dict[str, str], listed: dict[str, str]) -> None:
    """Through a pipe (and COLUMNS=80, as a shell may export it) every line is
    whole: a JSON value, the `watch it:` command, a table row."""
    address = ["--coordinator", cluster["coordinator"], "--etcd", cluster["etcd"], "--direct"]
    narrow = {"COLUMNS": "80"}
    waited = blockx(
        *address, "submit", "--function", "hello_world", "--call", json.dumps([LONG_NAME]),
        "--wait", env=narrow,
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr
    value = next(line for line in waited.stdout.splitlines() if "ReturnValueResultHandler" in line)
    assert json.loads(value.split(": ", 1)[1]) == [f"hello, {LONG_NAME}"]

    submitted = blockx(*address, "submit", "--function", "hello_world", "--call", "[1]", env=narrow)
    assert submitted.returncode == 0, submitted.stderr
    hint = next(line for line in submitted.stdout.splitlines() if "watch it:" in line)
    command = r"watch it: blockx watch \S+ --worker " + re.escape(cluster["worker"])
    assert re.fullmatch(command, hint)

    listing = blockx(*address, "tasks", "--state", "failed", env=narrow)
    assert listing.returncode == 0, listing.stderr
    row = next(line for line in listing.stdout.splitlines() if listed["failed"] in line)
    assert cluster["worker"] in row
    assert "'no_such_function' is not defined" in row
    assert "not shown" not in listing.stdout

    as_json = blockx(*address, "tasks", "--json", env=narrow)
    assert listed["failed"] in [t["task_id"] for t in json.loads(as_json.stdout)["tasks"]]


# ---- readers never create files ------------------------------------------------------


@pytest.mark.parametrize("command", ["backfill", "follow"])
def test_a_mistyped_block_database_is_named_and_not_created(command: str, tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    result = blockx(
        "--bundle-coordinator", "127.0.0.1:1", "--coordinator", "127.0.0.1:1", command,
        "--db", f"sqlite:///{typo}", "--sink-db", f"sqlite:///{tmp_path}/sink.db",
        "--function", "token_volume", "--source-table", "erc20_transfers",
        "--sink-table", "volume", *(["--from", "0", "--to", "9"] if command == "backfill" else []),
        env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")},
    )  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stderr.splitlines()[0] == f"error: no block database at {typo}"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("typo.db")]


# ---- which setting won -------------------------------------------------------------


def test_a_connection_failure_says_which_setting_won(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """The exports of an earlier dev up still in the shell (dead ports), the running
    one's dev.toml naming the live cluster: each error says where its address came
    from and what to unset; unset, the same command works."""
    home = tmp_path / "xdg"
    write_dev_config(
        {"ETCD_ENDPOINTS": cluster["etcd"], "BLOCKX_COORDINATOR": cluster["coordinator"]},
        dev_config_path({"XDG_CONFIG_HOME": str(home)}),
    )  # written by this process, which is alive: a running dev up's file
    with dead_addr() as stale_etcd, dead_addr() as stale_coordinator:
        shell = {"XDG_CONFIG_HOME": str(home), "ETCD_ENDPOINTS": stale_etcd}

        workers = blockx("workers", env=shell)
        assert workers.returncode == 3, workers.stdout + workers.stderr
        error, hint = workers.stderr.splitlines()
        assert error.startswith(f"error: cannot read the registry from etcd ({stale_etcd}: ")
        assert error.endswith(
            f"(ETCD_ENDPOINTS from the environment; dev.toml says {cluster['etcd']} — "
            "unset ETCD_ENDPOINTS?)"
        )
        assert "`unset ETCD_ENDPOINTS`" in hint

        reserve = blockx(
            "--direct", "reserve", "--timeout", "2",
            env={**shell, "BLOCKX_COORDINATOR": stale_coordinator},
        )  # fmt: skip
        assert reserve.returncode == 3, reserve.stdout + reserve.stderr
        assert reserve.stderr.splitlines()[-1] == (
            f"hint: {stale_coordinator} is BLOCKX_COORDINATOR from the environment; dev.toml says "
            f"{cluster['coordinator']} — unset BLOCKX_COORDINATOR? The environment also "
            "overrides dev.toml's ETCD_ENDPOINTS."
        )

        flagged = blockx(
            "--direct", "--coordinator", stale_coordinator, "reserve", "--timeout", "2",
            env={"XDG_CONFIG_HOME": str(home)},
        )  # fmt: skip
        assert flagged.returncode == 3, flagged.stdout + flagged.stderr
        assert flagged.stderr.splitlines()[-1] == (
            f"hint: {stale_coordinator} is from --coordinator; dev.toml says "
            f"{cluster['coordinator']} — leave --coordinator out?"
        )

        unset = blockx("workers", "--json", env={"XDG_CONFIG_HOME": str(home)})
        assert unset.returncode == 0, unset.stderr
        assert [w["worker_addr"] for w in json.loads(unset.stdout)] == [cluster["worker"]]
