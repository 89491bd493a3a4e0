"""``blockx`` commands that read a sink, run in-process with no BlockX variable
and no running ``blockx dev up`` to fall back on."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from blockx_cli.app import app


def blockx_offline(*argv: str, tmp_path: Path) -> tuple[int, str]:
    """The exit code and output of ``blockx ARGV``: SINK_DB_URL unset, the dev
    config looked for under ``tmp_path`` (where there is none)."""
    env = {"COLUMNS": "200", "XDG_CONFIG_HOME": str(tmp_path), "SINK_DB_URL": None}
    result = CliRunner().invoke(app, list(argv), env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result
    return result.exit_code, result.output
