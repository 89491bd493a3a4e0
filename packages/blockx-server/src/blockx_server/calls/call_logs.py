"""What functions print, in the Worker's log.

Two ways in: the ``CallOutput`` an executor sends with a call's suspension or
outcome (what the call wrote to ``sys.stdout`` / ``sys.stderr``), and the pipe that
is the executor's own stdout and stderr (a module's top level, bytes written to
file descriptors 1 and 2 directly, the interpreter's last words), attributed to
the call holding the executor when the Worker read them.

Every line is logged by the logger ``blockx.output`` as ``task T call N: line``
(``executor X: line`` when no call holds it), with control characters escaped, so
that function output never passes for a line of the Worker's own. A call gets at
most ``limit`` bytes into the log, counted here whatever the executor says; the
rest is dropped and counted, with one note when the call ends.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Final

log = logging.getLogger("blockx.output")

# Control characters (a carriage return, a terminal escape) are shown, not obeyed.
_ESCAPES: Final = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F) if c != 0x09}
# A raw line longer than this is logged in pieces.
_MAX_RAW_LINE: Final = 64 * 1024


class _Account:
    __slots__ = ("dropped", "executor_id", "logged", "task_id")

    def __init__(self, executor_id: str, task_id: str | None) -> None:
        self.executor_id = executor_id
        self.task_id = task_id
        self.logged = 0
        self.dropped = 0


class CallLogs:
    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._accounts: dict[int, _Account] = {}  # calls that printed and have not ended
        self._raw: dict[str, bytes] = {}  # executor -> its pipe's unfinished line

    @property
    def open(self) -> bool:
        """Some call has printed and not ended."""
        return bool(self._accounts)

    def output(
        self, executor_id: str, call_id: int, task_id: str | None, text: str, dropped: int
    ) -> None:
        """A ``CallOutput``: ``dropped`` bytes of the call's output never left its
        executor (over its bound)."""
        account = self._account(executor_id, call_id, task_id)
        account.dropped += dropped
        self._log(call_id, account, text.split("\n"))

    def raw(self, executor_id: str, data: bytes, call_id: int, task_id: str | None) -> None:
        """Bytes from the executor's pipe (b"" at its end); ``call_id`` holds the
        executor now (0: none)."""
        pending = self._raw.pop(executor_id, b"") + data
        lines = pending.split(b"\n")
        rest = lines.pop()
        if not data:  # the pipe closed: its last line ends here
            if rest:
                lines.append(rest)
        elif len(rest) > _MAX_RAW_LINE:
            lines.append(rest)
        else:
            self._raw[executor_id] = rest
        if not lines:
            return
        texts = [line.decode("utf-8", "replace") for line in lines]
        if call_id:
            self._log(call_id, self._account(executor_id, call_id, task_id), texts, end=False)
        else:
            for text in texts:
                log.info("executor %s: %s", executor_id, text.translate(_ESCAPES))

    def ended(self, call_ids: Iterable[int]) -> None:
        """These calls ended: a note for each that printed past its bound."""
        for call_id in call_ids:
            account = self._accounts.pop(call_id, None)
            if account is not None and account.dropped:
                self._note(call_id, account)

    def executor_gone(self, executor_id: str) -> None:
        """Its calls that printed will print no more there."""
        gone = [c for c, a in self._accounts.items() if a.executor_id == executor_id]
        self.ended(gone)

    def _account(self, executor_id: str, call_id: int, task_id: str | None) -> _Account:
        account = self._accounts.get(call_id)
        if account is None:
            account = self._accounts[call_id] = _Account(executor_id, task_id)
        return account

    def _log(self, call_id: int, account: _Account, lines: list[str], *, end: bool = True) -> None:
        if end and lines and not lines[-1]:
            lines.pop()  # the text ended with a newline
        task = account.task_id or "(ended)"
        for line in lines:
            size = len(line.encode("utf-8", "surrogatepass")) + 1
            room = self._limit - account.logged
            if size > room:
                account.dropped += size - max(room, 0)
                if room <= 1:
                    account.logged = self._limit
                    continue
                line = line[: room - 1]
                size = room
            account.logged += size
            log.info("task %s call %d: %s", task, call_id, line.translate(_ESCAPES))

    def _note(self, call_id: int, account: _Account) -> None:
        log.warning(
            "task %s call %d: %d more bytes of output dropped (over CALL_MAX_LOG_BYTES, %d)",
            account.task_id or "(ended)",
            call_id,
            account.dropped,
            self._limit,
        )
