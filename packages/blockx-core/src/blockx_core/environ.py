"""Settings read from the environment over a file: the one rule for which wins."""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class EnvironOverFile(Mapping[str, str]):
    """``environ`` over ``file``: a set, non-blank variable wins, else the file's value
    (a variable set to blanks counts as unset when the file has the name)."""

    def __init__(self, environ: Mapping[str, str], file: Mapping[str, str]) -> None:
        self._environ = environ
        self._file = file

    def __getitem__(self, name: str) -> str:
        value = self._environ.get(name)
        if value is not None and value.strip():
            return value
        if name in self._file:
            return self._file[name]
        if value is not None:
            return value
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        yield from self._environ
        yield from (name for name in self._file if name not in self._environ)

    def __len__(self) -> int:
        return len(set(self._environ) | set(self._file))

    def from_file(self, name: str) -> bool:
        """The value of ``name`` is the file's (the environment does not set it)."""
        value = self._environ.get(name)
        return name in self._file and not (value is not None and value.strip())
