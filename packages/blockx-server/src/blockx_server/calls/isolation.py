"""How the Worker confines its executors with the OS (the executor does the steps
itself at start-up: ``blockx_executor.confine``).

* **Another user.** When the Worker runs as root, executors switch to
  ``EXECUTOR_USER`` (default ``nobody``) right after connecting: they cannot signal
  the Worker, read its ``/proc`` files or its private files (a ``--config`` file,
  keys), or write where that user cannot. That user must be able to read what
  executors import, which a Worker's own installation rarely allows (an
  interpreter or a checkout under a 0700 home): executors run from the executor
  runtime (``executor_runtime``), a root-owned copy of their code in
  ``EXECUTOR_RUNTIME_DIR``, with an interpreter of the Worker's Python version the
  user can read. A probe checks that once; where no such interpreter or runtime
  can be had, executors run as the Worker's user from its own interpreter, and one
  warning says why. An empty ``EXECUTOR_USER`` keeps the Worker's user. A Worker
  that is not root cannot switch and does not try.
* **Own session and parent-death signal.** Each executor is a session leader
  (signals sent to the Worker's process group do not reach it), and the kernel
  SIGKILLs it when the Worker dies.
* **Namespaces.** With the sandbox on, executors get their own network namespace
  (only a down loopback: no network, no abstract Unix sockets) and mount
  namespace (a ``/proc`` showing only the executor user's processes). Where the
  kernel refuses, executors run without them, with one warning.
* **Environment and files.** No variable of the Worker's reaches them; ``HOME``,
  the working directory and the temporary directory are a private directory per
  executor (0700, owned by its user), removed when it exits. A Worker whose
  executors switch user creates no file other users can write (its umask masks
  their write bit): a SQLite sink or block database it makes is not theirs to
  change.
* **Limits.** ``RLIMIT_AS`` (``EXECUTOR_MEMORY_LIMIT_BYTES``), ``RLIMIT_FSIZE``
  (``EXECUTOR_MAX_FILE_BYTES``), ``RLIMIT_NOFILE`` and, for a non-root user,
  ``RLIMIT_NPROC``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import shutil
import sys
import tempfile
from pathlib import Path

import msgspec

from blockx_server.calls import executor_runtime
from blockx_server.calls.executor_runtime import (
    DEFAULT_RUNTIME_DIR,
    ExecutorRuntime,
    RuntimeUnavailable,
)

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 30.0


class IsolationConfig(msgspec.Struct, frozen=True, kw_only=True):
    # The user executors run as when the Worker is root; "" = the Worker's user.
    user: str = "nobody"
    # RLIMIT_FSIZE of each executor; 0 = no limit.
    max_file_bytes: int = 1 << 30
    # Where a root Worker keeps the executor runtime that user can read.
    runtime_dir: str = DEFAULT_RUNTIME_DIR


class _Plan(msgspec.Struct, frozen=True):
    # The program and first arguments that start an executor.
    command: tuple[str, ...]
    run_as: tuple[int, int] | None
    namespaces: bool


class _Report(msgspec.Struct, frozen=True):
    """What the probe (``python -m blockx_executor --probe``) found to fail."""

    namespaces: str | None = None
    user: str | None = None


def executor_environment(home: Path) -> dict[str, str]:
    """All an executor's environment: nothing of the Worker's (no credentials)."""
    return {
        "PATH": os.defpath,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": str(home),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def _mask_write_by_others() -> None:
    """Nothing the Worker creates from now on is writable by other users (the
    executors' user among them). Never unmasked, even for a moment."""
    old = os.umask(0o077)
    os.umask(old | 0o002)
    if not old & 0o002:
        log.info(
            "umask %03o -> %03o: no file of the Worker's is writable by its executors",
            old,
            old | 0o002,
        )


class ExecutorIsolation:
    """Decides once (by a probe) what confinement works here, then gives each spawn
    its command, arguments and private directory."""

    def __init__(self, config: IsolationConfig, *, python: str, sandbox: bool, count: int) -> None:
        self._config = config
        self._python = python
        self._sandbox = sandbox
        # RLIMIT_NPROC counts every process and thread of the user: room for all
        # executors' threads and a little more, never a fork bomb.
        self._max_processes = max(64, 4 * count)
        self._plan: _Plan | None = None
        self._runtime: ExecutorRuntime | None = None
        self._dirs: dict[str, Path] = {}

    async def prepare(self) -> None:
        if self._plan is None:
            self._plan = await self._decide()

    def command(self) -> list[str]:
        """The program and first arguments that start an executor."""
        assert self._plan is not None, "prepare() first"
        return list(self._plan.command)

    async def _decide(self) -> _Plan:
        run_as = self._run_as()
        if run_as is not None:
            plan = await self._as_other_user(run_as)
            if plan is not None:
                _mask_write_by_others()
                return plan
        return await self._as_own_user()

    def _run_as(self) -> tuple[int, int] | None:
        if os.geteuid() != 0 or not self._config.user:
            return None
        try:
            entry = pwd.getpwnam(self._config.user)
        except KeyError:
            log.warning("EXECUTOR_USER=%s: no such user; executors run as root", self._config.user)
            return None
        return None if entry.pw_uid == 0 else (entry.pw_uid, entry.pw_gid)

    async def _as_other_user(self, run_as: tuple[int, int]) -> _Plan | None:
        """Executors from the runtime as ``run_as``, if an interpreter can run them;
        else None, after one warning that says why not."""
        try:
            runtime = await asyncio.to_thread(
                executor_runtime.install, Path(self._config.runtime_dir)
            )
        except RuntimeUnavailable as exc:
            why = f"no executor runtime in EXECUTOR_RUNTIME_DIR ({exc})"
        else:
            plan = await self._runtime_plan(runtime, run_as)
            if isinstance(plan, _Plan):
                self._runtime = runtime
                return plan
            runtime.close()
            why = plan
        log.warning(
            "EXECUTOR_USER=%s: %s; executors run as the Worker's user, where only the "
            "sandbox's audit hook keeps functions from its files (see docs/security.md)",
            self._config.user,
            why,
        )
        return None

    async def _runtime_plan(self, runtime: ExecutorRuntime, run_as: tuple[int, int]) -> _Plan | str:
        """The plan that runs ``runtime`` as ``run_as``, or why there is none."""
        uid, gid = run_as
        blocked = executor_runtime.unreachable(runtime.launcher, uid, gid)
        if blocked is not None:
            return f"uid {uid} cannot read {blocked} (EXECUTOR_RUNTIME_DIR)"
        tried: list[str] = []
        for python in executor_runtime.interpreters():
            blocked = executor_runtime.unreachable(Path(python).parent, uid, gid)
            if blocked is not None:
                tried.append(f"{python}: uid {uid} cannot read {blocked}")
                continue
            plan = _Plan(
                (python, "-I", "-S", "-B", "-u", str(runtime.launcher)), run_as, self._sandbox
            )
            report = await self._probe(plan)
            if isinstance(report, str):
                tried.append(f"{python}: {report}")
            elif report.user:
                tried.append(f"{python}: {report.user}")
            else:
                return self._confirmed(plan, report)
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        return f"no python{version} that uid {uid} can run ({'; '.join(tried) or 'none found'})"

    async def _as_own_user(self) -> _Plan:
        plan = _Plan((self._python, "-m", "blockx_executor"), None, self._sandbox)
        if not plan.namespaces:
            return plan
        report = await self._probe(plan)
        if isinstance(report, str):
            log.warning(
                "the executor confinement probe failed (%s): executors run without their "
                "own namespaces",
                report,
            )
            return _Plan(plan.command, None, namespaces=False)
        return self._confirmed(plan, report)

    def _confirmed(self, plan: _Plan, report: _Report) -> _Plan:
        if plan.namespaces and report.namespaces:
            log.warning(
                "executors run without their own network and mount namespaces: %s",
                report.namespaces,
            )
            return _Plan(plan.command, plan.run_as, namespaces=False)
        return plan

    async def _probe(self, plan: _Plan) -> _Report | str:
        """What the probe found to fail with ``plan``, or why it could not tell."""
        args = ["--probe", "--socket", "-", "--executor-id", "probe"]
        args += self._confinement_args(plan)
        home = Path(tempfile.mkdtemp(prefix="blockx-probe-"))
        try:
            if plan.run_as is not None:
                os.chown(home, *plan.run_as)
            proc = await asyncio.create_subprocess_exec(
                *plan.command,
                *args,
                env=executor_environment(home),
                cwd=str(home),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            async with asyncio.timeout(_PROBE_TIMEOUT_S):
                out, err = await proc.communicate()
        except (OSError, TimeoutError) as exc:
            return f"the probe failed: {exc}"
        finally:
            shutil.rmtree(home, ignore_errors=True)
        try:
            return msgspec.json.decode(out, type=_Report)
        except msgspec.DecodeError:
            lines = err.decode(errors="replace").strip().splitlines()
            return lines[-1] if lines else f"the probe exited with code {proc.returncode}"

    def _confinement_args(self, plan: _Plan) -> list[str]:
        args = []
        if plan.run_as is not None:
            args += ["--run-as", f"{plan.run_as[0]}:{plan.run_as[1]}"]
        if plan.namespaces:
            args.append("--namespaces")
        return args

    def private_dir(self, executor_id: str) -> Path:
        """A new private directory for ``executor_id`` (its HOME, cwd and TMPDIR)."""
        assert self._plan is not None, "prepare() first"
        path = Path(tempfile.mkdtemp(prefix=f"blockx-executor-{executor_id}-"))
        if self._plan.run_as is not None:
            os.chown(path, *self._plan.run_as)
        self._dirs[executor_id] = path
        return path

    def executor_args(self, private_dir: Path) -> list[str]:
        assert self._plan is not None, "prepare() first"
        return [
            *self._confinement_args(self._plan),
            "--parent-pid",
            str(os.getpid()),
            "--tmp-dir",
            str(private_dir),
            "--max-file-bytes",
            str(self._config.max_file_bytes),
            "--max-processes",
            str(self._max_processes),
        ]

    def release(self, executor_id: str) -> None:
        """The executor exited: remove its private directory."""
        path = self._dirs.pop(executor_id, None)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        for executor_id in list(self._dirs):
            self.release(executor_id)
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None
