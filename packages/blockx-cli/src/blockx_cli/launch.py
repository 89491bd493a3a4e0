"""The ``blockx`` executable's entry point.

Every command's module is imported when that command runs or shows its help
(``blockx_cli.app``). ``blockx chain ...`` (ingest, devnet) uses none of the root
options, which name the cluster: a command line that starts with ``chain`` gets an
app of the chain commands alone, the same commands with the same options and help.

Start-up makes a few hundred thousand objects (modules, classes, every command's
options) that live until exit: the cyclic collector's passes over them find nothing
and cost a tenth of a short command's time. Until the command starts its work
(``collect_cycles``) a collection waits for ``START_UP_GC_YOUNG`` new objects, which
start-up never reaches.
"""

from __future__ import annotations

import gc
import sys
from typing import Final

START_UP_GC_YOUNG: Final = 1_000_000

_DEFAULT_THRESHOLDS: Final = gc.get_threshold()


_deferred = False


def main() -> None:
    global _deferred
    _deferred = True
    gc.set_threshold(START_UP_GC_YOUNG, *_DEFAULT_THRESHOLDS[1:])
    if sys.argv[1:2] == ["chain"]:
        from blockx_cli.app import chain_only

        chain_only()
        return
    from blockx_cli.app import main as whole

    whole()


def collect_cycles() -> None:
    """The command's modules are loaded and its work starts: cycles are collected
    as usual from here on, the start-up's objects frozen out of the passes. Only
    after ``main``: a command run in another program (a test's CliRunner) leaves
    that program's collector alone."""
    global _deferred
    if _deferred:
        _deferred = False
        gc.freeze()
        gc.set_threshold(*_DEFAULT_THRESHOLDS)
