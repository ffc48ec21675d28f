"""Results on disk, written atomically: a reader sees the old file or the whole new one.

One statement of the write used by the sweep store, fit files, repro files and the native
kernel cache. The data goes to a unique temporary beside the target (``os.replace`` cannot
cross file systems; a unique name means concurrent writers never share one), is fsync-ed,
renamed onto the target, and the rename is made durable by fsync-ing the folder. On any
failure, an interrupt too, the temporary is removed.

Also one statement of the wait for another process's work on a shared file
(:func:`exclusive_lock`: the native kernel cache's and the SITL's builds).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import time
from pathlib import Path

#: temporaries are ``.<target name>.<random>`` + this suffix: nothing else in a folder matches it
TMP_SUFFIX = ".quadjax-tmp"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# temporaries are created 0600; results get the mode open() would give them (read at import:
# os.umask can only be read by setting it, which is not safe once threads run)
_FILE_MODE = 0o666 & ~_umask()


def is_temporary(path: Path) -> bool:
    """True for a temporary :func:`write_atomic` left behind (a killed writer)."""
    return path.name.startswith(".") and path.name.endswith(TMP_SUFFIX)


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (a crash right after could otherwise undo it)."""
    with contextlib.suppress(OSError):  # not every file system lets a folder be fsync-ed
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path, write, *, mode: int | None = None) -> Path:
    """Write ``path`` through ``write(binary_file)`` atomically (module docstring); ``mode``:
    its permission bits (default: what ``open()`` gives under the umask). Returns the path."""
    path = Path(path)
    tmp = fd = None
    try:
        while fd is None:
            # The name is chosen before the file exists, so a signal landing anywhere after the
            # create, even before open() returns, leaves a name to remove (mkstemp's did not: a
            # SIGTERM between its create and its return left a temporary behind).
            tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}{TMP_SUFFIX}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # another writer's: not ours to remove; another name
                tmp = None
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _FILE_MODE if mode is None else mode)
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    fsync_folder(path.parent)
    return path


@contextlib.contextmanager
def exclusive_lock(path, timeout: float, poll: float = 0.1):
    """Hold an exclusive advisory lock (``flock``) on the file ``path`` (created 0600, with its
    folder, if absent) for the ``with`` block, waiting up to ``timeout`` s for another process to
    release it; past that, ``TimeoutError``. The kernel closes the descriptor, and so drops the lock,
    when the holder dies: a killed builder never leaves the others waiting."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path}: still held by another process after {timeout:g} s") from None
                time.sleep(poll)
        yield
    finally:
        os.close(fd)  # releases the lock
