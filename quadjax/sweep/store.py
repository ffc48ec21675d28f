"""Incremental sweep results on disk, and resume after an interruption.

A results folder holds::

    manifest.json          format, the resolved config and its hash, vehicles, chunk size,
                           chunks done, versions, timings; "complete" once aggregated
    chunks/chunk_000000.npz  one per chunk of vehicles: per-vehicle arrays, the chunk's
                           error-histogram counts, kept trajectories
    summary.json, vehicles.npz, trajectories.npz, plots/*.png   written at the end

A chunk file is written to a temporary name, flushed to disk and renamed into place
(``os.replace`` is atomic), so a chunk is either wholly there or absent: a run killed at
any moment loses at most the chunk in flight. On resume the chunk files themselves say
what is done (the manifest's list can lag one chunk behind them); the final aggregation
reads chunks 0 … n−1, each once, so nothing is lost or counted twice.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np

FORMAT = "quadjax-sweep/1"
#: the files a sweep writes at the end (removed by --overwrite together with chunks/)
OUTPUTS = ("summary.json", "vehicles.npz", "trajectories.npz")


def _atomic_write(path: Path, write) -> None:
    """Write through ``write(file)`` to a temporary file, fsync, then rename onto ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    _atomic_write(Path(path), lambda f: f.write(json.dumps(obj, indent=2, sort_keys=False).encode()))


def write_npz(path: Path, arrays: dict) -> None:
    _atomic_write(Path(path), lambda f: np.savez(f, **arrays))


class SweepStore:
    """One results folder (see the module docstring)."""

    def __init__(self, root: Path, manifest: dict):
        self.root = Path(root)
        self.manifest = manifest

    @property
    def chunk_size(self) -> int:
        return int(self.manifest["chunk_size"])

    @property
    def num_chunks(self) -> int:
        return int(self.manifest["num_chunks"])

    @classmethod
    def open(cls, root, *, config: dict, config_hash: str, vehicles: int, chunk_size: int,
             overwrite: bool = False, versions: dict | None = None) -> "SweepStore":
        """Resume the sweep in ``root`` if it holds this config (same hash), else start one.

        A folder holding another sweep is an error unless ``overwrite``; resuming keeps the
        stored chunk size (results do not depend on it; the chunk files do)."""
        root = Path(root)
        path = root / "manifest.json"
        if path.exists() and not overwrite:
            try:
                manifest = json.loads(path.read_text())
            except (OSError, ValueError):
                raise ValueError(f"{path} is unreadable; pass --overwrite to start this sweep afresh there") from None
            if manifest.get("format") != FORMAT or manifest.get("config_hash") != config_hash:
                raise ValueError(
                    f"{root} holds a different sweep (its config or quadjax/jax version differs); "
                    f"pass --overwrite to replace it or --out DIR to write elsewhere"
                )
            store = cls(root, manifest)
            store._remove_temporaries()
            return store
        cls._clear(root)
        num_chunks = -(-vehicles // chunk_size)
        manifest = {
            "format": FORMAT, "config_hash": config_hash, "vehicles": vehicles, "chunk_size": chunk_size,
            "num_chunks": num_chunks, "chunks_done": [], "complete": False, "versions": versions or {},
            "config": config,
        }
        (root / "chunks").mkdir(parents=True, exist_ok=True)
        write_json(path, manifest)
        return cls(root, manifest)

    @staticmethod
    def _clear(root: Path) -> None:
        """Remove what a sweep writes (only its own files: the folder may hold others)."""
        chunks = root / "chunks"
        if chunks.is_dir():
            for f in chunks.glob("chunk_*.npz*"):
                f.unlink()
        for name in OUTPUTS + ("manifest.json",):
            (root / name).unlink(missing_ok=True)
        plots = root / "plots"
        if plots.is_dir():
            for f in plots.glob("*.png"):
                f.unlink()

    def _remove_temporaries(self) -> None:
        for f in (self.root / "chunks").glob("*.tmp"):
            f.unlink()

    def chunk_path(self, i: int) -> Path:
        return self.root / "chunks" / f"chunk_{i:06d}.npz"

    def completed(self) -> list[int]:
        """Chunks whose file is present and readable (a damaged one is removed, to be redone)."""
        done = []
        for i in range(self.num_chunks):
            path = self.chunk_path(i)
            if not path.exists():
                continue
            try:
                with np.load(path) as z:
                    first = int(z["vehicle_index"][0])
            except (OSError, ValueError, KeyError, IndexError, zipfile.BadZipFile):
                path.unlink()
                continue
            if first != i * self.chunk_size:
                raise ValueError(f"{path} holds vehicles from {first}, expected {i * self.chunk_size}; "
                                 f"pass --overwrite to start afresh")
            done.append(i)
        return done

    def write_chunk(self, i: int, arrays: dict) -> None:
        write_npz(self.chunk_path(i), arrays)
        self.manifest["chunks_done"] = sorted(set(self.manifest["chunks_done"]) | {i})
        write_json(self.root / "manifest.json", self.manifest)

    def read_chunk(self, i: int) -> dict:
        with np.load(self.chunk_path(i)) as z:
            return {k: z[k] for k in z.files}

    def finish(self, summary: dict, extra: dict | None = None) -> None:
        write_json(self.root / "summary.json", summary)
        self.manifest.update(extra or {})
        self.manifest["complete"] = True
        write_json(self.root / "manifest.json", self.manifest)
