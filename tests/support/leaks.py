"""Leak checks that count only what the test itself left: other processes on the machine
create and remove shared-memory entries of their own at any time."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

SHM = Path("/dev/shm")


def shm_entries() -> set[str]:
    """The names in /dev/shm now."""
    return set(os.listdir(SHM))


def leaked_shm(before: set[str]) -> set[str]:
    """Entries made since ``before`` that no live process maps or holds open: left behind.

    An entry another process made and still uses is mapped by it (a semaphore is mapped
    by every process that opened it), so it does not count against the test.
    """
    new = shm_entries() - before
    if not new:
        return set()
    held: set[str] = set()
    for proc in psutil.process_iter():
        try:
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
            fds = [os.readlink(fd) for fd in Path(f"/proc/{proc.pid}/fd").iterdir()]
        except (OSError, psutil.Error):
            continue
        held.update(name for name in new if f"/dev/shm/{name}" in maps)
        held.update(name for name in new if f"/dev/shm/{name}" in fds)
    return {name for name in new if name not in held and (SHM / name).exists()}
