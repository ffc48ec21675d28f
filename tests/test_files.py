"""quadjax.files.write_atomic: a reader sees the old file or the whole new one, and no
interruption, wherever it lands, leaves a temporary behind."""

import os
import stat

import pytest

from quadjax import files
from quadjax.files import TMP_SUFFIX, is_temporary, write_atomic


def _temporaries(folder):
    return [p for p in folder.iterdir() if is_temporary(p)]


def test_a_write_replaces_the_file_with_the_umask_mode(tmp_path):
    target = tmp_path / "a.json"
    target.write_bytes(b"old")
    write_atomic(target, lambda f: f.write(b"new"))
    assert target.read_bytes() == b"new" and not _temporaries(tmp_path)
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
    write_atomic(target, lambda f: f.write(b"x"), mode=0o640)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failing_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, error):
    target = tmp_path / "a.npz"
    target.write_bytes(b"old")

    def write(f):
        f.write(b"half")
        raise error

    with pytest.raises(type(error)):
        write_atomic(target, write)
    assert target.read_bytes() == b"old" and not _temporaries(tmp_path)


def test_a_signal_between_the_create_and_its_return_leaves_no_temporary(tmp_path, monkeypatch):
    # A signal handler runs between bytecodes: it can land after the file exists but before the
    # writer holds its descriptor (CI once caught a SIGTERM'd sweep leaving one behind).
    real_open = os.open

    def open_then_signal(path, flags, *args):
        fd = real_open(path, flags, *args)
        if flags & os.O_EXCL:
            os.close(fd)
            raise KeyboardInterrupt
        return fd

    monkeypatch.setattr(files.os, "open", open_then_signal)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "a.npz", lambda f: f.write(b"x"))
    assert list(tmp_path.iterdir()) == []


def test_another_writers_temporary_is_never_touched(tmp_path, monkeypatch):
    theirs = tmp_path / f".a.npz.{'0' * 16}{TMP_SUFFIX}"
    theirs.write_bytes(b"theirs")
    names = iter(["0" * 16, "1" * 16])
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(names))
    write_atomic(tmp_path / "a.npz", lambda f: f.write(b"mine"))
    assert theirs.read_bytes() == b"theirs" and (tmp_path / "a.npz").read_bytes() == b"mine"
    assert _temporaries(tmp_path) == [theirs]
