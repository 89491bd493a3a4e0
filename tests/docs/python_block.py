"""Runs one Python doc block as a script: ``python python_block.py BLOCK.py``.

Docs write ``await`` at the top level, as the ``python -m asyncio`` REPL accepts it. A
block that does is compiled with ``PyCF_ALLOW_TOP_LEVEL_AWAIT`` and its code runs as
one coroutine under ``asyncio.run``; any other block runs as it is. Either way
tracebacks name the block file's own lines.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import sys
from pathlib import Path
from typing import Any


def main(path: Path) -> None:
    source = path.read_text()
    code = compile(source, str(path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": str(path)}
    sys.argv = [str(path)]
    sys.path[0] = str(path.parent)
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, namespace))  # the doc's own code, by design
    else:
        exec(code, namespace)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
