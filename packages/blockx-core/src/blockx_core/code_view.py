"""Function Code View: immutable snapshots of user function sources, one epoch each.

The Worker loads the user's function modules (one source text per file stem),
and every real change to that set becomes a new :class:`CodeSnapshot` with the
next epoch. A task pins the current epoch when it is activated
(``TaskContext.TaskCodeEpoch`` in the specification) and resolves all its calls
against that snapshot, so code updates only affect later tasks.

A superseded snapshot is kept while any task pins it, and for at least
``retention_ms`` after it was superseded (the specification: no shorter than
``MaxTaskTimeoutMs``), so a task that resolved the epoch without pinning it can
still finish. :meth:`FunctionCodeView.collect` drops the rest; the adapter calls
it when :meth:`FunctionCodeView.next_collect_ms` comes due.

Modules import each other by file stem; each :class:`FunctionSource` carries the
siblings its imports reach, so a task's calls see its own epoch's helpers
(:mod:`blockx_core.function_imports`).

Everything here is pure: sources arrive as strings, time as ``now_ms``.
Parsing uses :mod:`ast` and :func:`compile` (no import, no execution).
"""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import keyword
import re
from collections.abc import Iterable, Mapping

import msgspec

from blockx_core.deadlines import DeadlineHeap
from blockx_core.errors import BlockxUsageError, InvalidConfig
from blockx_core.function_imports import import_closures, sibling_imports
from blockx_core.ids import TaskId


class CodeLoadError(ValueError):
    """The source set cannot become a snapshot; ``problems`` holds one line per cause.

    Unlike a module that does not parse (which only disables that module), these
    break the whole set: a function name claimed by two modules would make calls
    ambiguous, and a file name that is not a module name cannot be imported.
    """

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


class NoSnapshotError(BlockxUsageError):
    """A task was pinned before any code was published (the Worker is not ready)."""


class ImportedModule(msgspec.Struct, frozen=True):
    """A sibling module that a module imports: its source and its ``digest`` (as in
    :class:`FunctionSource`)."""

    source: str
    digest: str


class FunctionSource(msgspec.Struct, frozen=True):
    """The source of one module, as executors load it.

    ``package`` holds the sibling modules its import statements reach, directly or
    through each other, from the same snapshot (see :mod:`blockx_core.function_imports`).
    ``digest`` is what executors cache the loaded module by: the hex sha256 of the
    UTF-8 source for a module that imports no sibling, otherwise a sha256 over its
    name and source and its package's, so that a changed helper loads anew.
    """

    module: str
    source: str
    digest: str
    package: dict[str, ImportedModule] = msgspec.field(default_factory=dict)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _set_digest(module_digests: Iterable[tuple[str, str]]) -> str:
    """One digest for a set of modules: independent of order, unambiguous because
    module names are identifiers (no NUL, no newline) and digests are hex."""
    hasher = hashlib.sha256()
    for module, digest in sorted(module_digests):
        hasher.update(f"{module}\0{digest}\n".encode())
    return hasher.hexdigest()


def _file(module: str) -> str:
    return f"{module}.py"


def _join_names(names: list[str]) -> str:
    if len(names) == 2:
        return f"both {names[0]} and {names[1]}"
    return ", ".join(names[:-1]) + f" and {names[-1]}"


# dict=True only makes room for the cached digest; the fields stay read-only.
class CodeSnapshot(msgspec.Struct, frozen=True, dict=True):
    """An immutable set of modules published as one epoch.

    ``modules`` holds every module, including those in ``parse_errors`` (their
    source takes part in the digest, so fixing them makes a new epoch);
    ``functions`` maps each callable function name to the module defining it.
    Treat the dicts as read-only: snapshots are shared by every task pinning them.
    """

    epoch: int
    modules: dict[str, FunctionSource]
    functions: dict[str, str]
    parse_errors: dict[str, str]

    def resolve(self, function: str) -> FunctionSource | None:
        """The module that defines ``function``, or None (see :meth:`describe_missing`)."""
        module = self.functions.get(function)
        return None if module is None else self.modules[module]

    def describe_missing(self, function: str) -> str:
        """A message for a user whose call names a function this snapshot lacks."""
        parts = [f"function {function!r} is not defined in function code epoch {self.epoch}."]
        if function.startswith("_"):
            parts.append("Names starting with '_' are private helpers and cannot be called.")
        close = difflib.get_close_matches(function, list(self.functions), n=3)
        if close:
            parts.append("Did you mean " + " or ".join(repr(name) for name in close) + "?")
        elif not self.functions:
            parts.append("No callable functions are loaded.")
        if self.parse_errors:
            broken = ", ".join(
                f"{_file(module)} ({error})" for module, error in sorted(self.parse_errors.items())
            )
            parts.append(f"It may be defined in a module that failed to parse: {broken}.")
        return " ".join(parts)

    @functools.cached_property
    def digest(self) -> str:
        """Digest of the module set: equal for equal sources, whatever the epoch or order."""
        return _set_digest((name, _sha256(src.source)) for name, src in self.modules.items())


def _public_defs(tree: ast.Module) -> list[str]:
    # Only statements directly in the module body: a def under `if`/`try` or inside
    # a class or another function is not a callable entry point.
    names = (
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and not node.name.startswith("_")
    )
    # A name redefined in one module counts once (the last definition wins at import).
    return list(dict.fromkeys(names))


def _parse(source: str, filename: str) -> ast.Module:
    try:
        return ast.parse(source, filename=filename)
    except (RecursionError, MemoryError):
        # CPython's parser reports a too-deep nesting of some expressions this way.
        raise SyntaxError("source is nested too deeply to parse") from None


def top_level_functions(source: str) -> list[str]:
    """Callable function names of a module: top-level ``def`` / ``async def``,
    in source order, without private names (``_helper``). Raises SyntaxError."""
    return _public_defs(_parse(source, "<function source>"))


def _load_module(module: str, source: str) -> ast.Module:
    """Parse and compile the module, so errors that only the compiler sees
    (``return`` outside a function, ``await`` at top level) surface at load time
    rather than when the Executor imports it."""
    filename = _file(module)
    tree = _parse(source, filename)
    try:
        compile(tree, filename, "exec", dont_inherit=True)
    except (RecursionError, MemoryError):
        raise SyntaxError("source is nested too deeply to compile") from None
    return tree


def _describe_syntax_error(exc: SyntaxError) -> str:
    message = " ".join((exc.msg or "invalid syntax").split())
    if exc.lineno is None:
        return f"{type(exc).__name__}: {message}"
    return f"{type(exc).__name__} at line {exc.lineno}: {message}"


def _module_name_problem(module: str) -> str | None:
    if keyword.iskeyword(module):
        return f"{_file(module)}: module name {module!r} is a Python keyword; rename the file"
    if module.isidentifier():
        return None
    problem = f"{_file(module)}: module name {module!r} is not a valid Python identifier"
    suggestion = re.sub(r"\W", "_", module)
    if suggestion.isidentifier() and not keyword.iskeyword(suggestion):
        return f"{problem}; rename it, e.g. to {_file(suggestion)}"
    return f"{problem}; rename the file"


def build_snapshot(epoch: int, sources: Mapping[str, str]) -> CodeSnapshot:
    """Parse ``sources`` (module name → source text) into the snapshot of ``epoch``.

    A module that does not parse lands in ``parse_errors`` and the others keep
    working. Bad module names and a public function defined by two modules raise
    :class:`CodeLoadError` listing every such problem.
    """
    problems: list[str] = []
    digests: dict[str, str] = {}
    trees: dict[str, ast.Module] = {}
    parse_errors: dict[str, str] = {}
    defined_in: dict[str, list[str]] = {}
    for module in sorted(sources):
        source = sources[module]
        name_problem = _module_name_problem(module)
        if name_problem is not None:
            problems.append(name_problem)
            continue
        try:
            digests[module] = _sha256(source)
        except UnicodeEncodeError:
            problems.append(f"{_file(module)}: source is not valid UTF-8 text")
            continue
        try:
            trees[module] = _load_module(module, source)
        except SyntaxError as exc:
            parse_errors[module] = _describe_syntax_error(exc)
            continue
        for name in _public_defs(trees[module]):
            defined_in.setdefault(name, []).append(module)
    modules = _with_packages(sources, digests, trees)
    for name in sorted(defined_in):
        owners = defined_in[name]
        if len(owners) > 1:
            problems.append(
                f"function {name!r} is defined in {_join_names([_file(m) for m in owners])}"
            )
    if problems:
        raise CodeLoadError(problems)
    functions = {name: owners[0] for name, owners in sorted(defined_in.items())}
    return CodeSnapshot(
        epoch=epoch, modules=modules, functions=functions, parse_errors=parse_errors
    )


def _with_packages(
    sources: Mapping[str, str], digests: Mapping[str, str], trees: Mapping[str, ast.Module]
) -> dict[str, FunctionSource]:
    """Each module with the siblings its imports reach, and its load digest."""
    closures = import_closures(
        {module: sibling_imports(tree, module, digests) for module, tree in trees.items()}
    )
    load_digests: dict[str, str] = {}
    for module, digest in digests.items():
        package = closures.get(module, frozenset())
        if not package:
            load_digests[module] = digest
            continue
        # The module's own name leads: in an import cycle, both modules reach the
        # same set, yet each must load under its own digest.
        hasher = hashlib.sha256(f"{module}\0".encode())
        hasher.update(_set_digest((name, digests[name]) for name in (module, *package)).encode())
        load_digests[module] = hasher.hexdigest()
    return {
        module: FunctionSource(
            module=module,
            source=sources[module],
            digest=load_digests[module],
            package={
                name: ImportedModule(source=sources[name], digest=load_digests[name])
                for name in sorted(closures.get(module, ()))
            },
        )
        for module in digests
    }


def _sources_digest(sources: Mapping[str, str]) -> str | None:
    """What :attr:`CodeSnapshot.digest` would be for ``sources``; None when the
    set cannot be digested (build_snapshot will then explain why)."""
    try:
        return _set_digest((module, _sha256(source)) for module, source in sources.items())
    except UnicodeEncodeError:
        return None


class FunctionCodeView:
    """The epoch store of one Worker (or Sync Invoker). See the module docstring.

    Touched only from the adapter's event loop, so it needs no lock.
    """

    def __init__(self, retention_ms: int) -> None:
        if retention_ms < 0:
            raise InvalidConfig("retention_ms", f"must be >= 0 (got {retention_ms})")
        self._retention_ms = retention_ms
        self._current: CodeSnapshot | None = None
        # Retained snapshots by epoch, oldest first (epochs only grow).
        self._snapshots: dict[int, CodeSnapshot] = {}
        # Epoch -> when a newer epoch replaced it; the current epoch is absent.
        self._superseded_at_ms: dict[int, int] = {}
        self._pins: dict[TaskId, int] = {}
        self._pin_counts: dict[int, int] = {}
        # Drop times of the superseded epochs nobody pins. Only the current epoch takes
        # new pins, so an epoch enters once: when superseded unpinned, or at its last
        # unpin after that.
        self._collectable: DeadlineHeap[int] = DeadlineHeap()

    @property
    def retention_ms(self) -> int:
        return self._retention_ms

    @property
    def current(self) -> CodeSnapshot | None:
        return self._current

    def publish(self, sources: Mapping[str, str], now_ms: int) -> CodeSnapshot | None:
        """Make ``sources`` the current code. Returns the new snapshot, or None when
        the sources equal the current ones. On :class:`CodeLoadError` the current
        snapshot stays current and no epoch is used up."""
        current = self._current
        if current is not None and _sources_digest(sources) == current.digest:
            return None
        snapshot = build_snapshot(1 if current is None else current.epoch + 1, sources)
        if current is not None:
            self._superseded_at_ms[current.epoch] = now_ms
            if current.epoch not in self._pin_counts:
                self._collectable.set(current.epoch, now_ms + self._retention_ms)
        self._snapshots[snapshot.epoch] = snapshot
        self._current = snapshot
        return snapshot

    def pin(self, task_id: TaskId, now_ms: int) -> CodeSnapshot:
        """Pin the current snapshot for ``task_id`` (at activation) and return it.

        A task already pinned keeps its epoch, even if newer code was published
        since: activation is retried idempotently, the task's code never changes.
        ``now_ms`` is taken like every state change; pins never expire by time,
        the task ends them with :meth:`unpin` when it converges.
        """
        epoch = self._pins.get(task_id)
        if epoch is not None:
            return self._snapshots[epoch]
        if self._current is None:
            raise NoSnapshotError(
                f"cannot pin function code for task {task_id!r}: no code has been "
                "published yet (wait for the first snapshot before activating tasks)"
            )
        epoch = self._current.epoch
        self._pins[task_id] = epoch
        self._pin_counts[epoch] = self._pin_counts.get(epoch, 0) + 1
        return self._current

    def pinned(self, task_id: TaskId) -> CodeSnapshot | None:
        epoch = self._pins.get(task_id)
        return None if epoch is None else self._snapshots[epoch]

    def unpin(self, task_id: TaskId, now_ms: int) -> None:
        """Release a task's pin; unknown or already released tasks are fine.

        The snapshot itself goes only at the next :meth:`collect`, and only once
        its retention has passed."""
        epoch = self._pins.pop(task_id, None)
        if epoch is None:
            return
        remaining = self._pin_counts[epoch] - 1
        if remaining:
            self._pin_counts[epoch] = remaining
            return
        del self._pin_counts[epoch]
        superseded_ms = self._superseded_at_ms.get(epoch)
        if superseded_ms is not None:
            self._collectable.set(epoch, superseded_ms + self._retention_ms)

    def snapshot(self, epoch: int) -> CodeSnapshot | None:
        return self._snapshots.get(epoch)

    def epochs(self) -> list[int]:
        """Retained epochs, ascending; the last one is current."""
        return list(self._snapshots)

    def collect(self, now_ms: int) -> list[int]:
        """Drop superseded, unpinned snapshots whose retention has passed; return
        their epochs, ascending. The current snapshot is never dropped. Costs only
        the epochs dropped (a heap of drop times)."""
        dropped = sorted(self._collectable.pop_due(now_ms))
        for epoch in dropped:
            del self._snapshots[epoch]
            del self._superseded_at_ms[epoch]
        return dropped

    def next_collect_ms(self) -> int | None:
        """When :meth:`collect` could next drop something (possibly already past),
        or None while nothing is collectable. Unpins and publishes change the answer,
        so the adapter asks again after them and arms its timer from it."""
        return self._collectable.earliest_ms()
