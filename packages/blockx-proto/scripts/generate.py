"""Regenerate blockx_proto._gen from proto/ with betterproto2 (grpclib stubs).

Usage: uv run python packages/blockx-proto/scripts/generate.py [--out DIR]

The output directory is wiped and rewritten: betterproto2 owns its __init__.py.
tests/proto/test_generated_code.py runs this into a temporary directory and fails
when the committed code differs.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = PACKAGE_ROOT / "proto"
DEFAULT_OUT = PACKAGE_ROOT / "src" / "blockx_proto" / "_gen"


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def generate(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    plugin_dir = Path(sys.executable).parent
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--plugin=protoc-gen-python_betterproto2={plugin_dir / 'protoc-gen-python_betterproto2'}",
        f"--python_betterproto2_out={out}",
        "--python_betterproto2_opt=client_generation=async,server_generation=async",
        *(str(p.relative_to(PROTO_ROOT)) for p in proto_files()),
    ]
    subprocess.run(cmd, check=True, cwd=PROTO_ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    generate(args.out)


if __name__ == "__main__":
    main()
