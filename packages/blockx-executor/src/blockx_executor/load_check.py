"""Load one module the way a call would, in a child process, and say whether the
function can be called: ``blockx precheck --functions DIR`` uses it.

The child (``python -m blockx_executor.load_check``) reads one :class:`LoadCheck`
(msgpack) on stdin, installs the executor's sandbox, loads the module with the
executor's own :class:`~blockx_executor.code.CodeCache` (its top level runs, its
sibling imports resolve from the package) and writes one :class:`LoadVerdict`
on stdout. :func:`check_load` runs it, bounded in time: a top level that does not
finish is killed and reported as such.
"""

from __future__ import annotations

import os
import sys
from typing import Final

import msgspec

from blockx_executor.protocol import FailureKind, LoadCode

DEFAULT_TIMEOUT_S: Final = 10.0


class LoadCheck(msgspec.Struct, frozen=True):
    code: LoadCode
    function: str


class LoadVerdict(msgspec.Struct, frozen=True):
    """``kind`` is empty when the function can be called; ``message`` is one line,
    ``detail`` the whole report (with the traceback from the user's frames)."""

    kind: str = ""
    message: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.kind


def check_load(code: LoadCode, function: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> LoadVerdict:
    """Load ``code`` in a fresh child process and look ``function`` up in it."""
    import subprocess  # only the parent side starts processes

    request = msgspec.msgpack.encode(LoadCheck(code, function))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "blockx_executor.load_check"],
            input=request,
            capture_output=True,
            timeout=timeout_s,
            # As in an executor: no credentials from the caller's environment.
            env={"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"},
            check=False,
        )
    except subprocess.TimeoutExpired:
        message = (
            f"{code.module}.py did not finish loading within {timeout_s:g} s "
            "(its top level runs once per executor before the first call)"
        )
        return LoadVerdict(FailureKind.COMPILE_ERROR.value, message, message)
    try:
        return msgspec.json.decode(done.stdout, type=LoadVerdict)
    except msgspec.DecodeError:
        # The top level took the process down (os._exit, a crash in native code).
        stderr = done.stderr.decode(errors="replace").strip()
        message = f"{code.module}.py ended the process while loading (exit code {done.returncode})"
        return LoadVerdict(FailureKind.COMPILE_ERROR.value, message, f"{message}\n{stderr}".strip())


def one_line(detail: str) -> str:
    """The headline of a load failure and where in the user's code it happened."""
    lines = detail.splitlines()
    if not lines:
        return ""
    # 'File "helpers.py", line 3, in <module>': function modules are named by their
    # file name alone, library frames by a path.
    frames = [
        line.strip()[len('File "') :].partition('", line ')
        for line in lines
        if line.strip().startswith('File "')
    ]
    user = [(name, rest) for name, _, rest in frames if "/" not in name]
    if not user:
        return lines[0]
    name, rest = user[-1]
    return f"{lines[0]} (at {name} line {rest.split(',', 1)[0]})"


def _main() -> None:
    from blockx_executor.code import CodeCache, Unavailable
    from blockx_executor.sandbox import install_sandbox

    check = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=LoadCheck)
    sys.dont_write_bytecode = True
    # What the module prints goes to stderr: stdout carries only the verdict.
    verdict_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    install_sandbox()
    cache = CodeCache()
    cache.load(check.code)
    entry = cache.function(check.code.digest, check.function)
    verdict = (
        LoadVerdict(entry.kind.value, one_line(entry.message), entry.message)
        if isinstance(entry, Unavailable)
        else LoadVerdict()
    )
    verdict_out.write(msgspec.json.encode(verdict))
    verdict_out.flush()


if __name__ == "__main__":
    _main()
