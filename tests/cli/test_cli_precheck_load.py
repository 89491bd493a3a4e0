"""``blockx precheck --functions DIR``: the module is loaded as a call would load it
(its top level runs, its sibling imports resolve, in a child process bounded in
time), and a module that cannot load is one clear line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from blockx_cli.app import app

GOOD = "import helpers\n\ndef area(w, h):\n    return helpers.scale * w * h\n"


def blockx(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def functions(tmp_path: Path, **modules: str) -> Path:
    directory = tmp_path / "functions"
    directory.mkdir()
    for name, source in modules.items():
        (directory / f"{name}.py").write_text(source)
    return directory


def test_a_module_that_loads_passes(tmp_path: Path) -> None:
    directory = functions(tmp_path, shapes=GOOD, helpers="scale = 2\n")
    result = blockx("precheck", "area", "1", "2", "--functions", str(directory))
    assert result.exit_code == 0, result.output
    assert "ok: def area(w, h) (its module loads)" in result.output


@pytest.mark.parametrize(
    ("helpers", "words"),
    [
        (
            "import no_such_package\n",
            "shapes.py failed while loading: ImportError: helpers.py failed while loading: "
            "ModuleNotFoundError: No module named 'no_such_package' (at helpers.py line 1)",
        ),
        ("scale = 1 / 0\n", "ZeroDivisionError: division by zero (at helpers.py line 1)"),
        ("import socket\nsocket.create_connection(('127.0.0.1', 9))\n", "PermissionError"),
    ],
)
def test_a_module_that_cannot_load_is_one_clear_line(
    tmp_path: Path, helpers: str, words: str
) -> None:
    directory = functions(tmp_path, shapes=GOOD, helpers=helpers)
    result = blockx("precheck", "area", "1", "2", "--functions", str(directory))
    assert result.exit_code == 1, result.output
    (line,) = result.stdout.strip().splitlines()
    assert line.startswith("COMPILE_ERROR: ")
    assert words in line


def test_a_top_level_that_never_ends_is_cut_off(tmp_path: Path) -> None:
    directory = functions(tmp_path, shapes=GOOD, helpers="while True:\n    pass\n")
    result = blockx(
        "precheck", "area", "--functions", str(directory), "--load-timeout", "1", "--json"
    )
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["failure_code"] == "COMPILE_ERROR"
    assert data["loaded"] is False
    assert "did not finish loading within 1 s" in data["message"]


def test_functions_dir_is_honoured_and_the_signature_still_checked(tmp_path: Path) -> None:
    directory = functions(tmp_path, shapes=GOOD, helpers="scale = 2\n")
    result = blockx("precheck", "area", "1", "--json", env={"FUNCTIONS_DIR": str(directory)})
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["failure_code"] == "SIGNATURE_MISMATCH"
    assert data["loaded"] is False


def test_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    result = blockx("precheck", "area", "--functions", str(tmp_path / "nowhere"))
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_as_a_real_process(tmp_path: Path) -> None:
    directory = functions(tmp_path, shapes=GOOD, helpers="raise RuntimeError('no config')\n")
    binary = Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "blockx"
    if not binary.exists():
        binary = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "blockx"
    done = subprocess.run(
        [str(binary), "precheck", "area", "--functions", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done
    assert "RuntimeError: no config (at helpers.py line 1)" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
