"""One task's code must not reach other tasks, the Worker or the host: escapes a
hostile function tried, each against a real ``blockx-worker`` and its real
executors.

Most tests run the Worker with ``EXECUTOR_USER=-``: executors of the Worker's own
user, where only the sandbox's guard rails stand, the hardest case for them. The
tests of the user switch run the Worker as installed (the README's setup, as
root): executors as ``nobody`` from the executor runtime, and, with the runtime
where ``nobody`` cannot reach it, the fallback to the Worker's user with its
warning.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from grpclib.client import Channel
from processes import WorkerProcess, call_list_task, execute_result, run_to_end, serving
from support import proc_stat, wait_until

from blockx_chain.sink.sqlite import SqliteSink
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

SECRET = "blockx-test-secret-3f9c2a1b"

FUNCTIONS = '''
import os


def echo(x):
    return x


def forge_results():
    """Rebind the executor's result path: every later call would return "forged"."""
    from blockx_executor.runner import Runner

    def _complete(self, call_id, value, cpu_ns, io_ns, budget_ns):
        self._done_ids.append(call_id)
        self._done_results.append(b'"forged"')
        self._done_cpu.append(0)
        self._done_io.append(0)

    Runner._complete = _complete
    return "patched"


def disguised_forge():
    """Rebind the result path's code under another module's name: the hook lets it
    through (it does not look like the executor's), the integrity check sees it."""
    from blockx_executor.runner import Runner

    def _complete(self, call_id, value, cpu_ns, io_ns, budget_ns):
        self._done_ids.append(call_id)
        self._done_results.append(b'"forged"')
        self._done_cpu.append(0)
        self._done_io.append(0)

    Runner._complete.__module__ = "user"
    Runner._complete.__code__ = _complete.__code__
    return "patched"


def fork_exec(marker, how):
    """Start a shell through _posixsubprocess, which raises no audit event."""
    import sys

    if how == "module":
        import _posixsubprocess

        fork_exec = _posixsubprocess.fork_exec
    elif how == "subprocess":
        import subprocess

        fork_exec = subprocess._fork_exec
    else:
        del sys.modules["_posixsubprocess"]
        import _posixsubprocess

        fork_exec = _posixsubprocess.fork_exec
    r, w = os.pipe()
    command = [b"/bin/sh", b"-c", b"echo escaped > " + marker.encode()]
    pid = fork_exec(
        command, [b"/bin/sh"], True, (w,), None, None,
        -1, -1, -1, -1, -1, -1, r, w,
        True, False, -1, None, None, None, -1, None, False,
    )
    os.close(w)
    os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    return pid


def kill_worker():
    import signal

    fd = os.pidfd_open(os.getppid())
    signal.pidfd_send_signal(fd, signal.SIGKILL)
    return "sent"


def renice_worker():
    os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)
    return "reniced"


def sqlite_file(path):
    import sqlite3

    sqlite3.connect(path).execute("create table t (x)")
    return "created"


def sqlite_memory():
    import sqlite3

    return sqlite3.connect(":memory:").execute("select 1 + 1").fetchone()[0]


def fifo(path):
    os.mkfifo(path)
    return "created"


def worker_environ():
    with open(f"/proc/{os.getppid()}/environ", "rb") as f:
        return f.read().decode(errors="replace")


def worker_environ_by_fd():
    fd = os.open(f"/proc/self/../{os.getppid()}/environ", os.O_RDONLY)
    return os.read(fd, 1 << 16).decode(errors="replace")


def worker_environ_by_dir_fd(how):
    """The Worker's environment through a directory descriptor of /proc."""
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    relative = f"{os.getppid()}/environ"
    if how == "dir_fd":
        fd = os.open(relative, os.O_RDONLY, dir_fd=proc)
    elif how == "dev_fd":
        fd = os.open(f"/dev/fd/{proc}/{relative}", os.O_RDONLY)
    else:
        with open(relative, "rb", opener=lambda p, f: os.open(p, f, dir_fd=proc)) as f:
            return f.read().decode(errors="replace")
    return os.read(fd, 1 << 16).decode(errors="replace")


def read_file(path):
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def forge_ledger(sink):
    """Attach the sink's file to an in-memory database and write its ledger."""
    import sqlite3

    db = sqlite3.connect(":memory:")
    db.execute("ATTACH DATABASE ? AS sink", (sink,))
    db.execute(
        "INSERT INTO sink._blockx_written (table_name, block_number, block_hash, "
        "code_epoch, task_id, written_at_ms) VALUES ('t', 99, '0xforged', 0, 'forged', 0)"
    )
    db.commit()
    return "forged"


def vacuum_into(path):
    import sqlite3

    sqlite3.connect(":memory:").execute("VACUUM INTO ?", (path,))
    return "written"


def pid():
    return os.getpid()


def spin():
    while True:
        pass


def hog(n):
    return len(bytearray(n))


def whoami(config=None, sink=None):
    import ctypes
    import socket
    import tempfile

    # Native code gets past the audit hook: what the OS alone allows.
    libc = ctypes.CDLL(None, use_errno=True)

    def native_open(path, flags):
        fd = libc.open(path.encode(), flags, 0o644)
        if fd >= 0:
            libc.close(fd)
        return fd >= 0


    tmp = tempfile.gettempdir()
    info = os.stat(tmp)
    pids = {int(p) for p in os.listdir("/proc") if p.isdigit()}
    return {
        "uid": os.getuid(),
        "session_leader": os.getsid(0) == os.getpid(),
        "tmp": tmp,
        "tmp_owner": info.st_uid,
        "tmp_mode": info.st_mode & 0o777,
        "home": os.environ.get("HOME"),
        "environ": sorted(os.environ),
        "interfaces": [name for _, name in socket.if_nameindex()],
        "sees_worker": os.getppid() in pids,
        "native_reads_worker_environ": native_open(f"/proc/{os.getppid()}/environ", os.O_RDONLY),
        "native_reads_config": config is not None and native_open(config, os.O_RDONLY),
        "native_writes_sink": sink is not None and native_open(sink, os.O_RDWR),
        "native_writes_beside_sink": sink is not None
        and native_open(sink + "-journal", os.O_WRONLY | os.O_CREAT),
        "native_may_signal_worker": libc.kill(os.getppid(), 0) == 0,
    }
'''


@pytest.fixture(scope="module")
def functions_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("functions")
    (d / "escapes.py").write_text(FUNCTIONS)
    return d


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the executor's user (whoever it is) can write: where an escape
    would leave its file."""
    d = Path(tempfile.mkdtemp(prefix="blockx-escape-"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


StartWorker = Callable[..., WorkerProcess]


@pytest.fixture
def start_worker(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], functions_dir: Path, tmp_path: Path
) -> StartWorker:
    def start(
        program: str = "blockx-worker",
        *,
        config: Path | None = None,
        umask: int | None = None,
        **env: str,
    ) -> WorkerProcess:
        # A shell that sets the umask and execs the Worker: the Worker keeps its pid.
        script = 'exec "$0"' if config is None else f'exec "$0" --config {shlex.quote(str(config))}'
        if umask is not None:
            script = f"umask {umask:03o}; {script}"
        return WorkerProcess(
            {
                "ETCD_ENDPOINTS": etcd_server.endpoint,
                "WORKER_REGISTRY_PREFIX": unique_lane(),
                "FUNCTIONS_DIR": str(functions_dir),
                "EXECUTOR_COUNT": "1",
                "BLOCKX_TEST_SECRET": SECRET,
                **env,
            },
            tmp_path / "worker.log",
            program,
            wrapper=["/bin/sh", "-c", script] if config or umask is not None else (),
        )

    return start


@pytest_asyncio.fixture
async def worker(start_worker: StartWorker) -> AsyncIterator[worker_v1.WorkerServiceStub]:
    """A Worker whose executors run as its own user: only the guard rails stand."""
    async with serving(start_worker(EXECUTOR_USER="-")) as [stub]:
        yield stub


async def run(
    stub: worker_v1.WorkerServiceStub, task_id: str, function: str, calls: list[list[Any]]
) -> worker_v1.TaskUpdate:
    return await run_to_end(stub, call_list_task(task_id, function, calls), timeout=60)


async def outputs(
    stub: worker_v1.WorkerServiceStub, task_id: str, function: str, calls: list[list[Any]]
) -> list[Any]:
    final = await run(stub, task_id, function, calls)
    assert final.state is worker_v1.TaskState.SUCCEEDED, final
    values: list[Any] = json.loads(execute_result(final).plugin_results[0].result)
    return values


async def failure(
    stub: worker_v1.WorkerServiceStub, task_id: str, function: str, calls: list[list[Any]]
) -> str:
    final = await run(stub, task_id, function, calls)
    assert final.state is worker_v1.TaskState.FAILED, final
    result = execute_result(final)
    assert result.failure_code == "CALL_FAILED", result
    return result.failure_message


@pytest.mark.parametrize(
    ("function", "named"),
    [
        ("forge_results", "Runner._complete"),
        # Under another module's name the hook lets the change through; the check
        # compares the functions' code because the hook counted it.
        ("disguised_forge", "Runner._complete.__code__"),
    ],
)
async def test_a_call_that_rebinds_the_result_path_fails_and_later_tasks_are_not_forged(
    worker: worker_v1.WorkerServiceStub, function: str, named: str
) -> None:
    message = await failure(worker, f"t-{function}", function, [[]])
    assert "USER_ERROR" in message
    assert "the call changed the executor's own code" in message
    assert named in message
    # The executor exited; its replacement runs the next task with its own code.
    assert await outputs(worker, f"t-after-{function}", "echo", [[i] for i in range(50)]) == list(
        range(50)
    )


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ("module", "start or signal processes"),
        ("subprocess", "start or signal processes"),  # subprocess._fork_exec
        ("fresh import", "import _posixsubprocess"),
    ],
)
async def test_posixsubprocess_cannot_start_a_shell(
    worker: worker_v1.WorkerServiceStub, shared_dir: Path, how: str, words: str
) -> None:
    marker = shared_dir / "escaped"
    message = await failure(worker, "t-fork-exec", "fork_exec", [[str(marker), how]])
    assert "PermissionError" in message
    assert words in message
    assert not marker.exists()


async def test_pidfd_cannot_kill_the_worker(worker: worker_v1.WorkerServiceStub) -> None:
    message = await failure(worker, "t-pidfd", "kill_worker", [[]])
    assert "PermissionError" in message
    assert "start or signal processes" in message
    # The Worker is alive and serving (serving() also checks it exits 0).
    assert await outputs(worker, "t-after-pidfd", "echo", [[1]]) == [1]


async def test_the_worker_cannot_be_reniced(start_worker: StartWorker) -> None:
    worker = start_worker()
    async with serving(worker) as [stub]:
        message = await failure(stub, "t-renice", "renice_worker", [[]])
        assert "PermissionError" in message
        assert "change other processes' scheduling" in message
        assert os.getpriority(os.PRIO_PROCESS, worker.proc.pid) == 0


async def test_no_sqlite_and_no_fifo(
    worker: worker_v1.WorkerServiceStub, shared_dir: Path, tmp_path: Path
) -> None:
    database = shared_dir / "db.sqlite"
    message = await failure(worker, "t-sqlite", "sqlite_file", [[str(database)]])
    assert "PermissionError" in message
    assert "SQLite" in message
    assert not database.exists()
    # An in-memory database would ATTACH files: the sink's ledger, a VACUUM INTO copy.
    sink = await SqliteSink.open(tmp_path / "sink.db")
    try:
        await sink.replace_blocks("t", 1, [(1, "0x01", [{"v": 1}])])
        ledger = await sink.written("t", 1)
        message = await failure(worker, "t-attach", "forge_ledger", [[str(sink.path)]])
        assert "PermissionError" in message
        assert "SQLite" in message
        copy = shared_dir / "copy.db"
        message = await failure(worker, "t-vacuum", "vacuum_into", [[str(copy)]])
        assert "PermissionError" in message
        assert not copy.exists()
        message = await failure(worker, "t-sqlite-memory", "sqlite_memory", [[]])
        assert "PermissionError" in message
        assert await sink.written("t", 1) == ledger
    finally:
        await sink.close()
    pipe = shared_dir / "fifo"
    message = await failure(worker, "t-fifo", "fifo", [[str(pipe)]])
    assert "PermissionError" in message
    assert "write files" in message
    assert not pipe.exists()


@pytest.mark.parametrize("function", ["worker_environ", "worker_environ_by_fd"])
async def test_the_workers_environment_is_not_readable(
    worker: worker_v1.WorkerServiceStub, function: str
) -> None:
    message = await failure(worker, f"t-{function}", function, [[]])
    assert "PermissionError" in message
    assert SECRET not in message


async def test_a_directory_descriptor_does_not_open_the_workers_environment(
    worker: worker_v1.WorkerServiceStub,
) -> None:
    """``os.open("<ppid>/environ", dir_fd=<fd of /proc>)`` and its relatives: the
    relative path is decided against the directory the descriptor holds."""
    for how in ("dir_fd", "dev_fd", "opener"):
        message = await failure(worker, f"t-{how}", "worker_environ_by_dir_fd", [[how]])
        assert "PermissionError" in message, how
        assert "read other processes' files" in message, how
        assert SECRET not in message


def _private_config(directory: Path) -> Path:
    """A Worker's --config file only its user can read, holding a secret."""
    config = directory / "worker.toml"
    config.write_text(f'# SINK_DB_URL = "postgresql://blockx:{SECRET}@db/sink"\nTASK_SLOTS = 4\n')
    config.chmod(0o600)
    return config


async def test_the_workers_config_file_is_not_readable(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    config = _private_config(tmp_path)
    async with serving(start_worker(config=config, EXECUTOR_USER="-")) as [stub]:
        message = await failure(stub, "t-config", "read_file", [[str(config)]])
    assert "PermissionError" in message
    assert SECRET not in message


async def test_memory_over_the_limit_fails_the_call_not_the_worker(
    start_worker: StartWorker,
) -> None:
    async with serving(start_worker(EXECUTOR_MEMORY_LIMIT_BYTES=str(1 << 30))) as [stub]:
        message = await failure(stub, "t-hog", "hog", [[2 << 30]])
        assert "MemoryError" in message
        assert await outputs(stub, "t-small", "hog", [[1 << 20]]) == [1 << 20]


def _cpu_ticks(pid: int) -> int:
    fields = proc_stat(pid)
    return -1 if fields is None else int(fields[11])  # utime


async def test_a_busy_executor_dies_with_the_worker(start_worker: StartWorker) -> None:
    """The executor runs a call that never ends (so it never reads its socket) when the
    Worker is SIGKILLed: PR_SET_PDEATHSIG ends it."""
    worker = start_worker()
    executor_pid = 0
    try:
        await worker.wait_ready()
        channel = Channel("127.0.0.1", worker.port)
        try:
            stub = worker_v1.WorkerServiceStub(channel)
            [executor_pid] = await outputs(stub, "t-pid", "pid", [[]])
            before = _cpu_ticks(executor_pid)
            await stub.submit_task(
                worker_v1.SubmitTaskRequest(task=call_list_task("t-spin", "spin", [[]]))
            )
            await wait_until(
                lambda: _cpu_ticks(executor_pid) > before + 2, "the executor running spin()"
            )
        finally:
            channel.close()
            worker.kill()  # SIGKILL: the Worker cannot stop its executors itself
        await wait_until(
            lambda: proc_stat(executor_pid) is None, "the executor gone with its Worker"
        )
    finally:
        if executor_pid and proc_stat(executor_pid) is not None:
            os.kill(executor_pid, signal.SIGKILL)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the Worker switches users only as root")


def _removed(path: str) -> bool:
    return not Path(path).exists()


def _umask(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    [line] = [line for line in status.splitlines() if line.startswith("Umask:")]
    return int(line.split()[1], 8)


@pytest.fixture
def reachable_dir() -> Iterator[Path]:
    """A directory every user can search (but only root can write): what is in it
    is kept from the executor's user by the files' own permissions alone."""
    d = Path(tempfile.mkdtemp(prefix="blockx-reachable-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """A directory only root can enter."""
    d = Path(tempfile.mkdtemp(prefix="blockx-private-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@needs_root
async def test_executors_run_as_nobody_after_the_readmes_setup(
    start_worker: StartWorker, reachable_dir: Path
) -> None:
    """The Worker as this run installs it (the README's setup: a virtual environment
    whose interpreter and packages ``nobody`` may not reach), as root, by default."""
    config = _private_config(reachable_dir)
    sink = await SqliteSink.open(reachable_dir / "sink.db")
    try:
        await sink.replace_blocks("t", 1, [(1, "0x01", [{"v": 1}])])
        # Started with a umask that lets everyone write what it creates.
        worker = start_worker(config=config, umask=0o000)
        async with serving(worker) as [stub]:
            [info] = await outputs(stub, "t-whoami", "whoami", [[str(config), str(sink.path)]])
            umask = _umask(worker.proc.pid)
        assert len(await sink.written("t", 1)) == 1
    finally:
        await sink.close()
    assert "EXECUTOR_USER" not in worker.output()
    assert info["uid"] == 65534
    assert info["session_leader"]
    # A private temporary directory: HOME too, owned by the executor, 0700, and
    # removed when the executor exited (the Worker has stopped).
    assert info["tmp"] == info["home"]
    assert (info["tmp_owner"], info["tmp_mode"]) == (65534, 0o700)
    assert _removed(info["tmp"])
    assert SECRET not in json.dumps(info)
    assert "BLOCKX_TEST_SECRET" not in info["environ"]
    # Its own network namespace (only loopback) and a /proc without the Worker.
    assert info["interfaces"] == ["lo"]
    assert not info["sees_worker"]
    # Past the audit hook (ctypes), the OS still keeps it from the Worker, its
    # --config file and the sink's file (and from writing beside it).
    assert not info["native_reads_worker_environ"]
    assert not info["native_may_signal_worker"]
    assert not info["native_reads_config"]
    assert not info["native_writes_sink"]
    assert not info["native_writes_beside_sink"]
    assert _removed(f"{sink.path}-journal")
    # Nothing the Worker creates (a SQLite sink, its journals) is the executors' to write.
    assert umask & 0o002


@needs_root
async def test_an_unreachable_runtime_falls_back_to_the_workers_user_with_a_warning(
    start_worker: StartWorker, private_dir: Path
) -> None:
    worker = start_worker(EXECUTOR_RUNTIME_DIR=str(private_dir / "runtime"))
    async with serving(worker) as [stub]:
        [info] = await outputs(stub, "t-whoami-root", "whoami", [[]])
    log = worker.output()
    assert info["uid"] == 0
    [line] = [line for line in log.splitlines() if "EXECUTOR_USER=nobody" in line]
    assert "executors run as the Worker's user" in line
    assert f"uid 65534 cannot read {private_dir} (EXECUTOR_RUNTIME_DIR)" in line
    # The documented limit of this fallback: native code, past the audit hook, can
    # read the Worker's /proc files (hidepid does not hide a process from its user).
    assert info["native_reads_worker_environ"]
    # Everything else of the confinement still holds.
    assert info["session_leader"]
    assert info["interfaces"] == ["lo"]
    assert "BLOCKX_TEST_SECRET" not in info["environ"]
