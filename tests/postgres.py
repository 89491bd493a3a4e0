"""A real PostgreSQL server for tests: initdb + pg_ctl into a fresh directory.

The binaries are Debian's (``/usr/lib/postgresql/<version>/bin``, newest first)
or the ones on PATH; ``scripts/setup.sh`` installs them. PostgreSQL refuses to
run as root, so as root the server runs as the ``postgres`` user, in a
``mkdtemp`` directory chowned to it (pytest's tmp_path lives under a 0700
folder that user cannot enter). It listens on 127.0.0.1 and a free port, with
fsync off: the tests never need the data after a crash of the machine.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import asyncpg
from support import free_port

from blockx_chain.schema import BLOCK_TABLES
from blockx_chain.url import PostgresUrl, parse_blockdb_url

SERVER_USER = "postgres"


def find_postgres_bin() -> Path | None:
    """The directory holding initdb and pg_ctl, or None when PostgreSQL is absent."""
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for candidate in debian:
        if (candidate / "initdb").is_file() and (candidate / "pg_ctl").is_file():
            return candidate
    initdb = shutil.which("initdb")
    if initdb is not None and shutil.which("pg_ctl") is not None:
        return Path(initdb).parent
    return None


class PostgresServer:
    """One server; ``url(database)`` is a BLOCKDB_URL for a database on it."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="blockx-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self._as_root = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self._as_root:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}{log}")

    def start(self) -> None:
        if self._as_root:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.dir, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N")
        self.start_server()

    def start_server(self) -> None:
        """Start the initialised server (again, after stop_server)."""
        options = f"-h 127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-w", "-l", str(self.log), "-o", options, "start")

    def stop_server(self) -> None:
        """Stop the server and keep its data."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-m", "fast", "stop")

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        try:
            if (self.data / "postmaster.pid").exists():
                self.stop_server()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    async def new_database(self) -> str:
        """The URL of a new empty database of the caller's own."""
        name = f"t_{secrets.token_hex(6)}"
        conn = await asyncpg.connect(self.url())
        try:
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()
        return self.url(name)


async def read_only_role(url: str, *, grants: str = "SELECT") -> PostgresUrl:
    """A login role of its own granted ``grants`` on the chain tables (the block
    tables and ``chain``) of the database at ``url``, made by the superuser as the
    operator makes io.blockdb_executor's (docs/blockdb-executor.md); its URL."""
    role = f"sql_{secrets.token_hex(4)}"
    tables = ", ".join([t.name for t in BLOCK_TABLES] + ["chain"])
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f"CREATE ROLE {role} LOGIN")
        await conn.execute(f"GRANT {grants} ON {tables} TO {role}")
    finally:
        await conn.close()
    executor = parse_blockdb_url(url.replace("postgres@", f"{role}@", 1))
    assert isinstance(executor, PostgresUrl)
    return executor
