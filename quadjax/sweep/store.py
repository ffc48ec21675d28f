"""Incremental sweep results on disk, and resume after an interruption.

A results folder holds::

    manifest.json          format, the resolved config, the sweep's identity and its hash,
                           vehicles, chunk size, chunks done, plots written, timings;
                           "complete" once aggregated
    chunks/chunk_000000.npz  one per chunk of vehicles: per-vehicle arrays, the chunk's
                           error-histogram counts, kept trajectories, and the identity hash
    summary.json, vehicles.npz, trajectories.npz, plots/*.png, plots/player.html   written at the end
    .quadjax-sweep.lock    the lock of the sweep writing here (it holds that run's pid)

Only one sweep writes into a folder at a time: :meth:`SweepStore.open` takes an exclusive,
non-blocking ``flock`` on the lock file for as long as the store is open, so a second
sweep (with ``--overwrite`` or not) is refused at once instead of mixing its chunks in.
The kernel drops the lock when its holder exits, however it exits: a stale lock file
never blocks anything.

Every file is written to a unique temporary name beside it, flushed to disk and renamed
into place (``os.replace`` is atomic), so a file is either wholly there or absent: a run
killed at any moment loses at most the chunk in flight. On resume the chunk files
themselves say what is done (the manifest's list can lag one chunk behind them). Each is
verified whole before it counts (zip CRCs, every member present, this sweep's identity,
its vehicle range); a damaged or foreign chunk is removed and flown again, and the final
aggregation reads chunks 0 … n−1, each once, so nothing is lost, mixed or counted twice.

Several processes (:mod:`quadjax.distributed`) share one folder, which must then be the same
folder for all of them (a shared file system): process 0 opens it as above, holding the lock
and writing the manifest, with this run's ``run`` stamp; the others :meth:`SweepStore.join`
it, checking that stamp (a copy of the folder on another disk would not have it), and only
write the chunk files of their share. A chunk is one file whoever flew it, so resuming with
any number of processes finds the same chunks.

A folder is written into only if it is absent, empty, or holds a sweep (a manifest).
``overwrite`` replaces another sweep, and deletes only the files a sweep writes: the
manifest, the chunks, :data:`OUTPUTS` and the plots the manifest lists.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np

from quadjax.files import is_temporary, write_atomic

FORMAT = "quadjax-sweep/3"  # 3: kept trajectories hold the whole state and the mixer report
#: the files a sweep writes at the end (removed by --overwrite together with its chunks and plots)
OUTPUTS = ("summary.json", "vehicles.npz", "trajectories.npz")
LOCK = ".quadjax-sweep.lock"
#: members a store adds to each chunk (not results: :meth:`SweepStore.read_chunk` drops them)
_STAMP = ("identity", "members")


def write_json(path: Path, obj) -> None:
    write_atomic(path, lambda f: f.write(json.dumps(obj, indent=2, sort_keys=False).encode()))


def write_npz(path: Path, arrays: dict) -> None:
    write_atomic(path, lambda f: np.savez(f, **arrays))


def identity_hash(config_hash: str, versions: dict) -> str:
    """The hash every chunk of a sweep carries: its config's hash and everything else its
    numbers depend on (``versions``: package versions, physics backend, platform, dtype)."""
    text = json.dumps({"config": config_hash, **versions}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class FolderLock:
    """An exclusive, non-blocking ``flock`` on ``folder``/.quadjax-sweep.lock, which holds the
    holder's pid (for the error a second sweep gets). Closing the file (or the holder's
    exit) releases it. The lock file is never deleted: unlinking it while another process
    waits to open it would let two processes lock two different files."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self._file = None

    def acquire(self) -> "FolderLock":
        path = self.folder / LOCK
        f = open(path, "a+b")  # noqa: SIM115 — held open for as long as the lock is held
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder(f)
            f.close()
            raise ValueError(f"{self.folder}: another sweep (pid {holder}) is writing here; wait for it "
                             f"to finish, or stop it, or write elsewhere with --out DIR") from None
        except BaseException:
            f.close()
            raise
        f.truncate(0)
        f.write(f"{os.getpid()}\n".encode())
        f.flush()
        self._file = f
        return self

    @staticmethod
    def _holder(f) -> str:
        """The pid in the lock file (the holder writes it just after locking: look twice)."""
        for _ in range(2):
            f.seek(0)
            text = f.read(32).decode(errors="replace").strip()
            if text:
                return text
            time.sleep(0.05)
        return "unknown"

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the last descriptor releases the flock
            self._file = None

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):  # a store dropped without close() must not keep its folder locked
        self.release()


def _check_folder(root) -> Path:
    """``root`` as a Path, created if absent; a one-line ValueError naming it if it cannot be."""
    if str(root).strip() == "":
        raise ValueError('"": an empty results folder name (it would write into the current folder); '
                         "name a folder, e.g. --out results/sweep")
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise ValueError(f"{root}: not a folder (a file of that name is in the way)")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{root}: cannot create the results folder ({err.strerror or err})") from None
    return root


def _foreign(root: Path) -> list[str]:
    """What in ``root`` a sweep did not write (a folder without a manifest holds no sweep):
    everything but the lock file, this store's temporaries and an empty chunks/ folder."""
    found = []
    for entry in sorted(root.iterdir()):
        if entry.name == LOCK or is_temporary(entry):
            continue
        if entry.name == "chunks" and entry.is_dir() and all(is_temporary(f) for f in entry.iterdir()):
            continue
        found.append(entry.name)
    return found


def _refuse_foreign(root: Path) -> None:
    """A ValueError if ``root`` holds no sweep (no manifest) but files a sweep did not write."""
    if (root / "manifest.json").exists():
        return
    foreign = _foreign(root)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", …" if len(foreign) > 5 else "")
        raise ValueError(f"{root}: not empty and not a sweep's results folder (it holds {shown}); "
                         f"pass --out DIR for a new or empty folder, or --overwrite to write "
                         f"the sweep's files there anyway (other files are kept)")


class SweepStore:
    """One results folder (see the module docstring), locked while open: use it as a context
    manager, or call :meth:`close`."""

    def __init__(self, root: Path, manifest: dict, lock: FolderLock | None = None, primary: bool = True):
        self.root = Path(root)
        self.manifest = manifest
        self._lock = lock
        #: whether this store owns the manifest (process 0's); the others only write chunks
        self.primary = primary
        #: (chunk, reason) of the chunks :meth:`completed` found damaged and removed
        self.damaged: list[tuple[int, str]] = []

    @property
    def chunk_size(self) -> int:
        return int(self.manifest["chunk_size"])

    @property
    def num_chunks(self) -> int:
        return int(self.manifest["num_chunks"])

    @property
    def identity(self) -> str:
        return self.manifest["identity"]

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> "SweepStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @classmethod
    def open(cls, root, *, config: dict, config_hash: str, vehicles: int, chunk_size: int,
             overwrite: bool = False, versions: dict | None = None, reasons: dict | None = None) -> "SweepStore":
        """Lock ``root`` and resume the sweep there if it has this identity, else start one.

        config_hash: the hash of the config alone; versions: the rest of the identity (see
        :func:`identity_hash`); reasons: why a ``versions`` entry has its value here (used
        only in the error that says what differs). A folder holding another sweep, or files
        that are not a sweep's, is an error unless ``overwrite``; resuming keeps the stored
        chunk size (results do not depend on it; the chunk files do)."""
        root = _check_folder(root)
        if not overwrite:  # before the lock file: a refused folder is left as it was found
            _refuse_foreign(root)
        lock = FolderLock(root)
        try:
            lock.acquire()
        except OSError as err:
            raise ValueError(f"{root}: cannot write here ({err.strerror or err})") from None
        try:
            return cls._open_locked(root, lock, config, config_hash, vehicles, chunk_size, overwrite,
                                    versions or {}, reasons or {})
        except BaseException:
            lock.release()
            raise

    @classmethod
    def join(cls, root, *, identity: str, run: str) -> "SweepStore":
        """The folder process 0 opened for this run (its manifest carries ``run``), to write chunks
        into: no lock, no manifest writes. A ValueError if the folder is not that one."""
        path = Path(root) / "manifest.json"
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError):
            manifest = None
        if not isinstance(manifest, dict) or manifest.get("run") != run or manifest.get("identity") != identity:
            found = "no readable manifest" if manifest is None else f"the manifest of run {manifest.get('run')!r}"
            raise ValueError(f"{root}: holds {found}, not the one process 0 wrote for this run ({run!r}); "
                             f"every process needs the same results folder (a shared file system)")
        return cls(Path(root), manifest, None, primary=False)

    def begin_run(self, run: str, processes: int) -> None:
        """Stamp the manifest with this run (process 0, before the others :meth:`join`)."""
        self.manifest.update(run=run, processes=processes)
        write_json(self.root / "manifest.json", self.manifest)

    @classmethod
    def _open_locked(cls, root, lock, config, config_hash, vehicles, chunk_size, overwrite, versions, reasons):
        path = root / "manifest.json"
        identity = identity_hash(config_hash, versions)
        previous = None
        if path.exists():
            try:
                previous = json.loads(path.read_text())
            except (OSError, ValueError):
                if not overwrite:
                    raise ValueError(f"{path}: unreadable; pass --overwrite to start this sweep afresh there") from None
            if not overwrite:
                cls._check_same(root, previous, config_hash, versions, reasons)
                # the chunks are checked against the identity computed now, not the stored text
                store = cls(root, {**previous, "identity": identity}, lock)
                store._remove_temporaries()
                return store
        elif not overwrite:
            _refuse_foreign(root)  # again, under the lock
        cls._clear(root, previous if isinstance(previous, dict) else {})
        manifest = {
            "format": FORMAT, "config_hash": config_hash, "identity": identity, "vehicles": vehicles,
            "chunk_size": chunk_size, "num_chunks": -(-vehicles // chunk_size), "chunks_done": [],
            "complete": False, "versions": versions, "plots": [], "config": config,
        }
        write_json(path, manifest)  # first: a folder with a manifest is a sweep's, whatever else happens
        (root / "chunks").mkdir(exist_ok=True)
        return cls(root, manifest, lock)

    @staticmethod
    def _check_same(root: Path, manifest, config_hash: str, versions: dict, reasons: dict) -> None:
        """Refuse to resume a sweep of another identity, saying which part differs."""
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            found = manifest.get("format") if isinstance(manifest, dict) else None
            raise ValueError(f"{root}: holds a sweep of another format ({found!r}, this quadjax writes "
                             f"{FORMAT!r}); pass --overwrite to replace it or --out DIR to write elsewhere")
        diffs = []
        if manifest.get("config_hash") != config_hash:
            diffs.append("its config differs")
        stored = manifest.get("versions") or {}
        for key in sorted(set(stored) | set(versions)):
            if stored.get(key) != versions.get(key):
                why = f": {reasons[key]}" if key in reasons else ""
                diffs.append(f"its {key} differs ({stored.get(key)} there, {versions.get(key)} here{why})")
        if diffs:
            raise ValueError(f"{root}: holds a different sweep ({'; '.join(diffs)}); pass --overwrite to "
                             f"replace it or --out DIR to write elsewhere")

    @staticmethod
    def _clear(root: Path, manifest: dict) -> None:
        """Remove what a sweep writes, and only that: the folder may hold the user's own files
        (plots/ too: only the plots the old manifest lists go)."""
        chunks = root / "chunks"
        if chunks.is_dir():
            for f in chunks.iterdir():
                if (f.name.startswith("chunk_") and f.name.endswith(".npz")) or is_temporary(f):
                    f.unlink()
        for name in OUTPUTS + ("manifest.json",):
            (root / name).unlink(missing_ok=True)
        for name in manifest.get("plots") or []:
            target = root / name
            # only names inside the folder: a damaged or hostile manifest cannot point elsewhere
            if isinstance(name, str) and not Path(name).is_absolute() and ".." not in Path(name).parts:
                target.unlink(missing_ok=True)

    def _remove_temporaries(self) -> None:
        """Temporaries of this store's pattern left by a killed run: stale, since we hold the lock."""
        for folder in (self.root, self.root / "chunks"):
            if folder.is_dir():
                for f in folder.iterdir():
                    if is_temporary(f):
                        f.unlink(missing_ok=True)

    def chunk_path(self, i: int) -> Path:
        return self.root / "chunks" / f"chunk_{i:06d}.npz"

    def chunk_range(self, i: int) -> tuple[int, int]:
        """The vehicles first … end − 1 of chunk ``i``."""
        first = i * self.chunk_size
        return first, min(first + self.chunk_size, int(self.manifest["vehicles"]))

    def completed(self) -> list[int]:
        """The chunks whose file is present and whole (:meth:`verify`); a damaged one is removed,
        to be flown again, and listed in :attr:`damaged`."""
        done = []
        self.damaged = []
        for i in range(self.num_chunks):
            path = self.chunk_path(i)
            if not path.exists():
                continue
            problem = self.verify(i)
            if problem is None:
                done.append(i)
            else:
                path.unlink(missing_ok=True)
                self.damaged.append((i, problem))
        return done

    def verify(self, i: int) -> str | None:
        """What is wrong with chunk ``i``'s file, or None when it is whole and this sweep's."""
        path = self.chunk_path(i)
        try:
            with zipfile.ZipFile(path) as zf:
                bad = zf.testzip()  # reads every member and checks its CRC
            if bad is not None:
                return f"member {bad} fails its CRC check"
            with np.load(path) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
            return f"unreadable ({type(err).__name__}: {err})"
        return self._check_arrays(i, arrays)

    def _check_arrays(self, i: int, arrays: dict) -> str | None:
        if any(k not in arrays for k in _STAMP):
            return "no identity stamp (not written by this version of the sweep store)"
        if str(arrays["identity"]) != self.identity:
            return "it belongs to another sweep (its identity differs)"
        members = set(np.asarray(arrays["members"]).tolist())
        missing = sorted(members - set(arrays))
        if missing or set(arrays) - members - set(_STAMP):
            return f"members missing or unexpected ({', '.join(missing) or 'extra members'})"
        first, end = self.chunk_range(i)
        if "vehicle_index" not in arrays or not np.array_equal(arrays["vehicle_index"], np.arange(first, end)):
            return f"it does not hold vehicles {first}…{end - 1}"
        per_vehicle = {k: x for k, x in arrays.items()
                       if k not in _STAMP and k != "counts" and not k.startswith("kept_")}
        for k, x in per_vehicle.items():
            if x.ndim == 0 or len(x) != end - first:
                return f"member {k} has {x.shape[:1]} rows, expected {end - first}"
        return None

    def write_chunk(self, i: int, arrays: dict) -> None:
        stamped = dict(arrays, identity=np.asarray(self.identity), members=np.asarray(sorted(arrays)))
        write_npz(self.chunk_path(i), stamped)
        if self.primary:  # the others' chunks reach the manifest when process 0 finishes
            self.manifest["chunks_done"] = sorted(set(self.manifest["chunks_done"]) | {i})
            write_json(self.root / "manifest.json", self.manifest)

    def read_chunk(self, i: int) -> dict:
        with np.load(self.chunk_path(i)) as z:
            return {k: z[k] for k in z.files if k not in _STAMP}

    def finish(self, summary: dict, extra: dict | None = None) -> None:
        write_json(self.root / "summary.json", summary)
        self.manifest.update(extra or {})
        self.manifest["chunks_done"] = list(range(self.num_chunks))
        self.manifest["complete"] = True
        write_json(self.root / "manifest.json", self.manifest)
