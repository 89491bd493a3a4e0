"""How the Worker confines its executors with the OS (the executor does the steps
itself at start-up: ``blockx_executor.confine``).

* **Another user.** When the Worker runs as root, executors switch to
  ``EXECUTOR_USER`` (default ``nobody``) right after connecting: they cannot signal
  the Worker, read its ``/proc`` files or write where that user cannot. The user
  must be able to read the interpreter and its import paths (the virtual
  environment); a probe checks that once, and if not, executors run as the
  Worker's user, with one warning. An empty ``EXECUTOR_USER`` keeps the Worker's
  user. A Worker that is not root cannot switch and does not try.
* **Own session and parent-death signal.** Each executor is a session leader
  (signals sent to the Worker's process group do not reach it), and the kernel
  SIGKILLs it when the Worker dies.
* **Namespaces.** With the sandbox on, executors get their own network namespace
  (only a down loopback: no network, no abstract Unix sockets) and mount
  namespace (a ``/proc`` showing only the executor user's processes). Where the
  kernel refuses, executors run without them, with one warning.
* **Environment and files.** No variable of the Worker's reaches them; ``HOME``,
  the working directory and the temporary directory are a private directory per
  executor (0700, owned by its user), removed when it exits.
* **Limits.** ``RLIMIT_AS`` (``EXECUTOR_MEMORY_LIMIT_BYTES``), ``RLIMIT_FSIZE``
  (``EXECUTOR_MAX_FILE_BYTES``), ``RLIMIT_NOFILE`` and, for a non-root user,
  ``RLIMIT_NPROC``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import msgspec

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 30.0


class IsolationConfig(msgspec.Struct, frozen=True, kw_only=True):
    # The user executors run as when the Worker is root; "" = the Worker's user.
    user: str = "nobody"
    # RLIMIT_FSIZE of each executor; 0 = no limit.
    max_file_bytes: int = 1 << 30


class _Plan(msgspec.Struct, frozen=True):
    run_as: tuple[int, int] | None
    namespaces: bool


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


class ExecutorIsolation:
    """Decides once (by a probe) what confinement works here, then gives each spawn
    its arguments and private directory."""

    def __init__(self, config: IsolationConfig, *, python: str, sandbox: bool, count: int) -> None:
        self._config = config
        self._python = python
        self._sandbox = sandbox
        # RLIMIT_NPROC counts every process and thread of the user: room for all
        # executors' threads and a little more, never a fork bomb.
        self._max_processes = max(64, 4 * count)
        self._plan: _Plan | None = None
        self._dirs: dict[str, Path] = {}

    async def prepare(self) -> None:
        if self._plan is None:
            self._plan = await self._probe(self._wanted())

    def _wanted(self) -> _Plan:
        run_as = None
        if os.geteuid() == 0 and self._config.user:
            try:
                entry = pwd.getpwnam(self._config.user)
            except KeyError:
                log.warning(
                    "EXECUTOR_USER=%s: no such user; executors run as root", self._config.user
                )
            else:
                if entry.pw_uid != 0:
                    run_as = (entry.pw_uid, entry.pw_gid)
        return _Plan(run_as, namespaces=self._sandbox)

    async def _probe(self, wanted: _Plan) -> _Plan:
        if wanted.run_as is None and not wanted.namespaces:
            return wanted
        args = ["-m", "blockx_executor", "--probe", "--socket", "-", "--executor-id", "probe"]
        args += self._confinement_args(wanted)
        home = Path(tempfile.mkdtemp(prefix="blockx-probe-"))
        try:
            if wanted.run_as is not None:
                os.chown(home, *wanted.run_as)
            proc = await asyncio.create_subprocess_exec(
                self._python,
                *args,
                env=executor_environment(home),
                cwd=str(home),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
            )
            async with asyncio.timeout(_PROBE_TIMEOUT_S):
                out, _ = await proc.communicate()
            report = json.loads(out)
        except (OSError, TimeoutError, ValueError) as exc:
            log.warning("the executor confinement probe failed (%s): executors run unconfined", exc)
            return _Plan(None, namespaces=False)
        finally:
            shutil.rmtree(home, ignore_errors=True)
        run_as, namespaces = wanted.run_as, wanted.namespaces
        if run_as is not None and report.get("user"):
            log.warning(
                "EXECUTOR_USER=%s: %s; executors run as the Worker's user (make the "
                "interpreter and its virtual environment readable by %s)",
                self._config.user,
                report["user"],
                self._config.user,
            )
            run_as = None
        if namespaces and report.get("namespaces"):
            log.warning(
                "executors run without their own network and mount namespaces: %s",
                report["namespaces"],
            )
            namespaces = False
        return _Plan(run_as, namespaces)

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
