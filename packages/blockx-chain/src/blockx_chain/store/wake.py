"""Push for a SQLite block database: its writer wakes its readers after each commit.

Beside the database file ``chain.db`` is a directory ``chain.db-wake/``. A reader
that wants to be woken (``follow``) binds a Unix datagram socket in it, named by its
process id and a random part (``WakeSocket``); after every commit the writer sends
one byte to each socket there (``wake_readers``). The byte only wakes: the reader
then reads the database, which stays the truth, and polls as before when no byte
comes.

Best effort on both sides: a socket its reader no longer holds (the reader died)
refuses the byte, and the writer removes it; a full one already has a wake-up
waiting; any other failure is skipped (the reader's poll covers it). Paths too long
for a socket address (108 bytes) are reached through the directory's descriptor
(``/proc/self/fd/N/NAME``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
import socket
from pathlib import Path
from typing import Final

_log = logging.getLogger(__name__)

WAKE_SUFFIX: Final = "-wake"
_MAX_ADDRESS: Final = 107  # sun_path, less its terminating NUL
_SOCKET_SUFFIX: Final = ".sock"
# A reader reads at most this much per wake-up; what is in the datagrams is ignored.
_DRAIN_BYTES: Final = 64
_DRAIN_DATAGRAMS: Final = 1024
# The most sockets one commit wakes (the directory is read no further).
MAX_READERS: Final = 256


def wake_dir(database: Path) -> Path:
    """The directory of the wake sockets of the database file ``database``."""
    return database.with_name(database.name + WAKE_SUFFIX)


def _address(directory: Path, dir_fd: int, name: str) -> str:
    path = str(directory / name)
    return path if len(os.fsencode(path)) <= _MAX_ADDRESS else f"/proc/self/fd/{dir_fd}/{name}"


def wake_readers(database: Path) -> int:
    """One byte to every reader's socket of ``database`` (after a commit); the number
    woken. Never raises: a reader that misses it polls."""
    directory = wake_dir(database)
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return 0  # no reader has made the directory: nobody to wake
    woken = 0
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.setblocking(False)
            for seen, name in enumerate(os.listdir(dir_fd)):
                if seen >= MAX_READERS:
                    break
                if not name.endswith(_SOCKET_SUFFIX):
                    continue
                try:
                    sender.sendto(b"\x01", _address(directory, dir_fd, name))
                    woken += 1
                except ConnectionRefusedError:
                    # Nobody holds it any more: its reader died without removing it.
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=dir_fd)
                except BlockingIOError:
                    woken += 1  # its queue is full: a wake-up already waits there
                except OSError as exc:
                    _log.debug("cannot wake the reader at %s/%s: %s", directory, name, exc)
    except OSError as exc:
        _log.debug("cannot wake the readers of %s: %s", database, exc)
    finally:
        os.close(dir_fd)
    return woken


class WakeSocket:
    """A reader's socket in the database's wake directory: ``event`` is set whenever a
    writer committed since it was last cleared."""

    def __init__(self, database: Path) -> None:
        self.directory = wake_dir(database)
        self.event = asyncio.Event()
        self._name = f"{os.getpid()}-{secrets.token_hex(6)}{_SOCKET_SUFFIX}"
        self._sock: socket.socket | None = None
        self._dir_fd: int | None = None

    def open(self) -> bool:
        """Bind the socket; whether the reader will be woken (False: it polls only,
        with one log line saying why)."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        try:
            # A reader closing as this one opens may remove the empty directory.
            for _ in range(2):
                self.directory.mkdir(exist_ok=True)
                dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    sock.bind(_address(self.directory, dir_fd, self._name))
                    self._dir_fd = dir_fd
                    break
                except FileNotFoundError:
                    os.close(dir_fd)
            else:
                raise FileNotFoundError(errno.ENOENT, "removed under the bind", self.directory)
        except OSError as exc:
            sock.close()
            _log.warning(
                "no wake socket in %s (%s): the block database is polled only",
                self.directory,
                exc,
            )
            return False
        self._sock = sock
        loop.add_reader(sock.fileno(), self._readable)
        return True

    def _readable(self) -> None:
        assert self._sock is not None
        for _ in range(_DRAIN_DATAGRAMS):
            try:
                self._sock.recv(_DRAIN_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
        self.event.set()

    def close(self) -> None:
        sock, dir_fd = self._sock, self._dir_fd
        self._sock = self._dir_fd = None
        if sock is not None:
            asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        if dir_fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._name, dir_fd=dir_fd)
            os.close(dir_fd)
            with contextlib.suppress(OSError):
                self.directory.rmdir()  # the last reader's; others still use it otherwise
