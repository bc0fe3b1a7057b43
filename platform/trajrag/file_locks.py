"""Advisory file locks (``flock``) that name their holder in the error of whoever comes second.

The kernel drops an ``flock`` when its process ends however it ends, so a killed job leaves its
lock file behind but holds nothing: a re-run takes the lock at once. The holder writes its pid
and host into the file only so that errors can name it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
from pathlib import Path
from typing import Callable, Iterator


def lock_file(held: contextlib.ExitStack, path: Path, operation: int) -> int | None:
    """A descriptor of ``path`` (created if missing) locked with ``operation`` (``fcntl.flock``),
    closed, and so unlocked, when ``held`` closes; None when another holds it (``LOCK_NB``). A
    file system without locks is said on stderr and used unlocked."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    held.callback(os.close, fd)
    try:
        fcntl.flock(fd, operation)
    except BlockingIOError:
        return None
    except OSError as exc:  # ENOLCK, EOPNOTSUPP: e.g. an NFS mount without its lock daemon
        print(f"warning: {path}: cannot lock ({exc}); another process using it would not be noticed",
              file=sys.stderr)
    return fd


def sign(fd: int, what: str = "") -> None:
    """Write this process (pid, host, and ``what`` it is doing) into the held lock file ``fd``."""
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}{', ' + what if what else ''}\n".encode())


def holder(path: Path) -> str:
    """Who holds the lock file ``path``, as its holder signed it."""
    try:
        return path.read_text().strip() or "a process"
    except OSError:
        return "a process"


@contextlib.contextmanager
def claim(path: Path, job: str, refused: Callable[[str], Exception]) -> Iterator[None]:
    """Hold the lock file ``path`` alone while the block runs, signed with ``job``; when another
    process holds it, raise ``refused(its holder)`` at once, before the block does anything."""
    with contextlib.ExitStack() as held:
        fd = lock_file(held, path, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            raise refused(holder(path))
        sign(fd, job)
        yield
