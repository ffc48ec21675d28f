"""Results on disk, written atomically: a reader sees the old file or the whole new one.

One statement of the write used by the sweep store, fit files, repro files and the native
kernel cache. The data goes to a unique temporary beside the target (``os.replace`` cannot
cross file systems; a unique name means concurrent writers never share one), is fsync-ed,
renamed onto the target, and the rename is made durable by fsync-ing the folder. On any
failure, an interrupt too, the temporary is removed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

#: temporaries are ``.<target name>.<random>`` + this suffix: nothing else in a folder matches it
TMP_SUFFIX = ".quadjax-tmp"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files 0600; results get the mode open() would give them (read at import:
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
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _FILE_MODE if mode is None else mode)
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_folder(path.parent)
    return path
