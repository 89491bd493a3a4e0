"""Loading user function sources into the Function Code View.

A :class:`FunctionStore` yields the current source set (module name → source
text); :class:`DirectoryFunctionStore` reads it from ``FUNCTIONS_DIR``. A
:class:`CodeViewRefresher` polls the store and publishes each change to a
:class:`~blockx_core.code_view.FunctionCodeView` as a new epoch, so edited,
added and deleted files take effect for later tasks without a restart. Reading
the disk is a poll; dropping superseded epochs is not: a timer armed at the
view's ``next_collect_ms`` does it when it comes due.

A source set that cannot load (two files defining the same function, a file
name that is not a module name) is logged as one warning and the previous epoch
stays current: half-finished edits, such as moving a function between two
files, must not take running code away.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
from pathlib import Path
from typing import Final, Protocol

from blockx_core.code_view import CodeLoadError, CodeSnapshot, FunctionCodeView
from blockx_core.errors import InvalidConfig
from blockx_server.runtime.clock import Clock
from blockx_server.runtime.timer import DeadlineTimer

log = logging.getLogger(__name__)

FUNCTIONS_DIR_ENV: Final = "FUNCTIONS_DIR"

# A file that changes while it is read (an editor writing in place) is read again.
_READ_ATTEMPTS: Final = 3


class FunctionStoreError(Exception):
    """The store cannot produce a source set; ``str()`` is the one line users see."""


class FunctionStore(Protocol):
    """Where function sources live (a directory today, maybe a database later)."""

    async def load(self) -> dict[str, str]:
        """The complete current source set: module name → source text.

        Raises :class:`FunctionStoreError` when the set cannot be read."""
        ...


class DirectoryFunctionStore:
    """Every ``*.py`` file directly in ``directory``; the file stem is the module.

    Not recursive. Files starting with ``.`` or ``_`` are skipped: editors' temp
    and lock files (``.hello.py.swp``, ``.#hello.py``), ``__init__.py``. Modules
    import each other by their stems (:mod:`blockx_core.function_imports`).
    Each file is read through one open descriptor, so an editor that replaces
    files atomically (write a temp file, rename it over) is always seen as
    either the old or the new whole file. Source bytes are decoded the way
    Python decodes a module (UTF-8, a BOM, or a ``# coding:`` declaration).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._directory = Path(directory)

    @property
    def directory(self) -> Path:
        return self._directory

    async def load(self) -> dict[str, str]:
        return await asyncio.to_thread(self._read_all)

    def _where(self) -> str:
        return f"{str(self._directory)!r} ({FUNCTIONS_DIR_ENV})"

    def _read_all(self) -> dict[str, str]:
        try:
            entries = list(os.scandir(self._directory))
        except FileNotFoundError:
            raise FunctionStoreError(f"function directory {self._where()} does not exist") from None
        except NotADirectoryError:
            raise FunctionStoreError(
                f"function directory {self._where()} is not a directory"
            ) from None
        except OSError as exc:
            raise FunctionStoreError(
                f"function directory {self._where()} cannot be listed: {exc.strerror}"
            ) from None
        sources: dict[str, str] = {}
        for entry in sorted(entries, key=lambda e: e.name):
            name = entry.name
            if not name.endswith(".py") or name.startswith((".", "_")):
                continue
            try:
                if not entry.is_file():
                    continue
                raw = _read_stable(entry.path)
            except FileNotFoundError:
                # Deleted (or renamed away) between the listing and the read.
                continue
            except OSError as exc:
                raise FunctionStoreError(f"cannot read {entry.path}: {exc.strerror}") from None
            try:
                sources[name[: -len(".py")]] = importlib.util.decode_source(raw)
            except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
                # SyntaxError / LookupError: a malformed or unknown coding declaration.
                raise FunctionStoreError(f"cannot decode {entry.path}: {exc}") from None
        return sources


def _read_stable(path: str) -> bytes:
    """The file's bytes, re-read if its size or mtime moved during the read."""
    with open(path, "rb") as file:
        for _ in range(_READ_ATTEMPTS):
            before = os.fstat(file.fileno())
            raw = file.read()
            after = os.fstat(file.fileno())
            if (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns):
                break
            file.seek(0)
        # Still moving after a few tries: take the last read; the next poll sees the rest.
        return raw


class CodeViewRefresher:
    """Polls a :class:`FunctionStore` and publishes changes to a FunctionCodeView.

    Only this object publishes to the view, on the event loop that owns it.
    """

    def __init__(
        self,
        store: FunctionStore,
        view: FunctionCodeView,
        clock: Clock,
        poll_interval_ms: int,
    ) -> None:
        if poll_interval_ms <= 0:
            raise InvalidConfig("poll_interval_ms", f"must be > 0 (got {poll_interval_ms})")
        self._store = store
        self._view = view
        self._clock = clock
        self._poll_interval_ms = poll_interval_ms
        # Two overlapping refreshes could publish an older load after a newer one.
        self._lock = asyncio.Lock()
        self._first_snapshot = asyncio.Event()
        # The last problem logged, so a poll loop does not repeat it every interval.
        self._last_problem: str | None = None
        # The collection timer, armed only while run() runs.
        self._running = False
        self._collect_timer = DeadlineTimer(clock, self.rearm_collection)

    @property
    def view(self) -> FunctionCodeView:
        return self._view

    async def refresh_once(self) -> CodeSnapshot | None:
        """Load and publish once. Returns the new snapshot, or None when nothing
        changed or the set cannot load (logged; the previous epoch stays current).

        :class:`FunctionStoreError` propagates: the caller decides whether a
        store that cannot be read is fatal (at start-up) or transient."""
        async with self._lock:
            sources = await self._store.load()
            try:
                snapshot = self._view.publish(sources, self._clock.now_ms())
            except CodeLoadError as exc:
                self._report(f"function code not loaded, {self._kept()}: {exc}")
                return None
            if self._last_problem is not None:
                log.info("function code loads again")
                self._last_problem = None
            if self._view.current is not None:
                self._first_snapshot.set()
            if snapshot is not None:
                _log_snapshot(snapshot)
                self.rearm_collection()  # the superseded epoch now has a drop time
            return snapshot

    async def run(self) -> None:
        """Refresh every poll interval until cancelled; old snapshots are collected
        by a timer at the view's next collection time.

        A store that cannot be read on the first poll raises (a missing
        ``FUNCTIONS_DIR`` is a configuration error); later failures are logged
        and the current epoch keeps serving."""
        await self.refresh_once()
        self._running = True
        try:
            while True:
                # After each publish, and after each poll: a pin released by another
                # owner than rearm_collection's callers is seen within one interval.
                self.rearm_collection()
                await asyncio.sleep(self._poll_interval_ms / 1000)
                try:
                    await self.refresh_once()
                except FunctionStoreError as exc:
                    self._report(f"function code not reloaded, {self._kept()}: {exc}")
        finally:
            self._running = False
            self._collect_timer.cancel()

    def rearm_collection(self) -> None:
        """Collect what is due now and arm the timer for the view's next collection.

        Call it after anything that can move ``next_collect_ms`` earlier: a publish
        (done here) or an unpin (the Orchestrator calls it when a task converges).
        Does nothing unless :meth:`run` is running."""
        if not self._running:
            return
        now_ms = self._clock.now_ms()
        due_ms = self._view.next_collect_ms()
        if due_ms is not None and due_ms <= now_ms:
            dropped = self._view.collect(now_ms)
            if dropped:
                log.debug("function code epochs %s released", dropped)
            due_ms = self._view.next_collect_ms()
        # An armed timer may fire early; it only re-arms.
        self._collect_timer.arm(due_ms)

    async def wait_first_snapshot(self) -> CodeSnapshot:
        """Wait until the view has a current snapshot (the Worker's readiness)."""
        if self._view.current is None:
            await self._first_snapshot.wait()
        current = self._view.current
        assert current is not None  # set only once a snapshot is current
        return current

    def _kept(self) -> str:
        current = self._view.current
        if current is None:
            return "no function code is loaded yet"
        return f"epoch {current.epoch} stays current"

    def _report(self, problem: str) -> None:
        if problem != self._last_problem:
            log.warning("%s", problem)
            self._last_problem = problem


def _log_snapshot(snapshot: CodeSnapshot) -> None:
    log.info(
        "function code epoch %d: %d modules, %d functions",
        snapshot.epoch,
        len(snapshot.modules),
        len(snapshot.functions),
    )
    for module, error in sorted(snapshot.parse_errors.items()):
        log.warning(
            "function code epoch %d: %s.py does not parse (%s); its functions are not callable",
            snapshot.epoch,
            module,
            error,
        )
