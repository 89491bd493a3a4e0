"""``io.memory``: an in-memory key -> value map (JSON-compatible values).

Reads: ``get(key, default=None)``, ``mget(keys)``, ``has(key)``, ``keys(prefix="")``.
Writes (a Writer Plugin's scope only): ``put(key, value)`` (``set`` is the same),
``mput(mapping)``, ``delete(key)``. Seed it from a mapping or a JSON object file
(``IO_MEMORY_SEED_FILE``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from blockx_core.failures import IoErrorKind
from blockx_server.io.backends.arguments import bind_arguments
from blockx_server.io.errors import BackendError


class MemoryBackend:
    name = "memory"
    read_ops = frozenset({"get", "mget", "has", "keys"})
    write_ops = frozenset({"put", "set", "delete", "mput"})

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = dict(data or {})

    @classmethod
    def from_file(cls, path: Path) -> MemoryBackend:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read memory seed {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"memory seed {path} must hold a JSON object")
        return cls(data)

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        """Never: a Writer may change any key at any time, so nothing is cached."""
        return False

    def seed(self, data: Mapping[str, Any]) -> None:
        """For tests and configuration; not reachable from functions."""
        self._data.update(data)

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        match op:
            case "get":
                key, default = bind_arguments(
                    args, kwargs, "get(key, default=None)", ("key",), ("default",)
                )
                return self._data.get(_key(key), default)
            case "mget":
                (keys,) = bind_arguments(args, kwargs, "mget(keys: list)", ("keys",))
                if not isinstance(keys, list):
                    raise TypeError("mget(keys: list)")
                return [self._data.get(_key(k)) for k in keys]
            case "has":
                (key,) = bind_arguments(args, kwargs, "has(key)", ("key",))
                return _key(key) in self._data
            case "keys":
                (prefix,) = bind_arguments(args, kwargs, "keys(prefix: str = '')", (), ("prefix",))
                prefix = "" if prefix is None else prefix
                if not isinstance(prefix, str):
                    raise TypeError("keys(prefix: str = '')")
                return sorted(k for k in self._data if k.startswith(prefix))
            case "put" | "set":
                key, value = bind_arguments(args, kwargs, f"{op}(key, value)", ("key", "value"))
                self._data[_key(key)] = value
                return None
            case "mput":
                (mapping,) = bind_arguments(args, kwargs, "mput(mapping: dict)", ("mapping",))
                if not isinstance(mapping, dict):
                    raise TypeError("mput(mapping: dict)")
                for key in mapping:
                    _key(key)
                self._data.update(mapping)
                return None
            case "delete":
                (key,) = bind_arguments(args, kwargs, "delete(key)", ("key",))
                return self._data.pop(_key(key), None) is not None
        raise BackendError(IoErrorKind.UNKNOWN_OP, op)


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"keys are strings, got {type(key).__name__}")
    return key
