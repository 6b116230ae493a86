"""The models on this machine, what can be reclaimed, and Delete with the space it frees said first.

Listed: the hub cache's model repositories (``huggingface_hub.scan_cache_dir``; each ``.gguf`` file in a
snapshot is its own entry, since it is loaded on its own), Redline's converted GGUF folders, the starter, and
local folders named in the recent models. *Reclaimable*: partial downloads Redline left in the hub cache
(``*.redline-partial``), conversions that never finished (``.converting-*``), and converted folders whose
source GGUF is gone (not a file of the hub cache nor a recent model any more).

"Last used" is the newest access time of the entry's files (the hub cache's own ``last_accessed`` for a
repository), which most systems update at least once a day.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Optional

from ..errors import ModelSourceError
from ..paths import models_dir
from ..sources.gguf import cache_folder_for, is_complete
from ..sources.hub import PARTIAL
from ..sources.starter import STARTER_NAME, starter_folder
from ..units import format_bytes


@dataclass
class LocalModel:
    name: str
    kind: str  # "hub", "gguf", "converted", "starter", "folder", "partial", "unfinished", "orphaned"
    path: Path
    size_bytes: int
    last_used: Optional[float]  # seconds since the epoch
    model: str = ""  # what to pass as --model ("" for what cannot be loaded)
    reclaimable: bool = False
    note: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return [f for f in path.rglob("*") if f.is_file() and not f.is_symlink()]


def disk_bytes(path: Path) -> int:
    """The bytes ``path`` holds on disk: each file once (hard links and symlinks not followed), sparse files
    as what they really occupy."""
    seen, total = set(), 0
    for f in _files(path):
        st = f.stat()
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        total += min(st.st_size, getattr(st, "st_blocks", st.st_size // 512 + 1) * 512)
    return total


def _last_used(path: Path) -> Optional[float]:
    times = [f.stat().st_atime for f in _files(path)] if path.exists() else []
    return max(times) if times else None


def _hub_entries() -> tuple[list[LocalModel], list[Path]]:
    """The hub cache's models, and every .gguf file in it (converted folders' possible sources)."""
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import constants, scan_cache_dir

    try:
        # Named: scan_cache_dir's default is the cache huggingface_hub saw when it was first imported.
        info = scan_cache_dir(constants.HF_HUB_CACHE)
    except Exception:
        return [], []  # no hub cache yet
    rows, ggufs = [], []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        gguf_files = sorted(
            {f for rev in repo.revisions for f in rev.files if f.file_name.endswith(".gguf")},
            key=lambda f: f.file_name,
        )
        if gguf_files:
            for f in gguf_files:
                ggufs.append(Path(f.file_path))
                rows.append(
                    LocalModel(
                        f"{repo.repo_id}/{f.file_name}",
                        "gguf",
                        Path(f.file_path),
                        f.size_on_disk,
                        f.blob_last_accessed,
                        str(f.file_path),
                    )
                )
        else:
            rows.append(
                LocalModel(
                    repo.repo_id,
                    "hub",
                    Path(repo.repo_path),
                    disk_bytes(Path(repo.repo_path)),  # what Delete frees: partial downloads in it included
                    repo.last_accessed,
                    repo.repo_id,
                )
            )
        for partial in sorted(Path(repo.repo_path).glob(f"blobs/*{_partial_suffix()}")):
            rows.append(
                LocalModel(
                    f"{repo.repo_id} (partial download)",
                    "partial",
                    partial,
                    disk_bytes(partial),
                    partial.stat().st_mtime,
                    reclaimable=True,
                    note="a download that stopped part-way; fetching the model again continues it",
                )
            )
    return rows, ggufs


def _partial_suffix() -> str:

    return PARTIAL


def _converted(sources: Iterable[Path]) -> list[LocalModel]:

    root = models_dir() / "gguf"
    if not root.is_dir():
        return []
    owners = {}
    for src in sources:
        try:
            owners[cache_folder_for(src).name] = src
        except OSError:
            continue
    rows = []
    for folder in sorted(root.iterdir()):
        if not folder.is_dir():
            continue
        size = disk_bytes(folder)
        if folder.name.startswith(".converting-") or not is_complete(folder):
            rows.append(
                LocalModel(
                    folder.name,
                    "unfinished",
                    folder,
                    size,
                    _last_used(folder),
                    reclaimable=True,
                    note="a GGUF conversion that never finished",
                )
            )
        elif folder.name in owners:
            src = owners[folder.name]
            rows.append(
                LocalModel(
                    folder.name,
                    "converted",
                    folder,
                    size,
                    _last_used(folder),
                    str(src),
                    note=f"converted from {src.name}; rebuilt from it when deleted",
                )
            )
        else:
            rows.append(
                LocalModel(
                    folder.name,
                    "orphaned",
                    folder,
                    size,
                    _last_used(folder),
                    reclaimable=True,
                    note="converted from a GGUF file that is no longer in the hub cache or the recent models",
                )
            )
    return rows


def local_library(recent: Iterable[str] = ()) -> list[LocalModel]:
    """Everything on disk: models first, then what can be reclaimed. ``recent``: the recent models (the app's
    list), whose local folders and .gguf files are listed too and count as converted folders' sources."""

    rows: list[LocalModel] = []
    sf = starter_folder()
    if is_complete(sf):
        rows.append(LocalModel(STARTER_NAME, "starter", sf, disk_bytes(sf), _last_used(sf), "starter"))
    hub_rows, ggufs = _hub_entries()
    rows += hub_rows
    local_ggufs = []
    for spec in recent:
        p = Path(spec).expanduser()
        if spec.startswith(("http://", "https://")) or not p.is_absolute() or not p.exists():
            continue
        if p.is_file() and p.suffix == ".gguf":
            local_ggufs.append(p)
            rows.append(LocalModel(p.name, "gguf", p, disk_bytes(p), _last_used(p), str(p), note="a local file"))
        elif p.is_dir() and (p / "config.json").is_file():
            rows.append(LocalModel(p.name, "folder", p, disk_bytes(p), _last_used(p), str(p), note="a local folder"))
    rows += _converted(ggufs + local_ggufs)
    rows.sort(key=lambda r: (r.reclaimable, r.kind == "converted"))
    return rows


def reclaimable_bytes(rows: Iterable[LocalModel]) -> int:
    return sum(r.size_bytes for r in rows if r.reclaimable)


def delete_text(row: LocalModel) -> str:
    """What Delete would do, said before it does it."""
    return f"Deleting {row.name} frees {format_bytes(row.size_bytes)} ({row.path})."


def delete(row: LocalModel) -> int:
    """Delete ``row`` from disk; the bytes it freed (what ``delete_text`` said)."""
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import constants

    path = Path(row.path)
    allowed = [Path(constants.HF_HUB_CACHE).resolve(), models_dir().resolve()]
    if row.kind in ("folder",) or (row.kind == "gguf" and row.note == "a local file"):
        raise ModelSourceError(
            f"{path} is the user's own file, outside Redline's caches, so Redline does not delete it.",
            "Delete it with the file manager if you no longer need it.",
        )
    real = path.resolve() if path.is_symlink() else path.absolute()
    if not any(real == a or a in real.parents for a in allowed):
        raise ModelSourceError(f"{path} is outside Redline's caches, so Redline does not delete it.", "")
    if not path.exists() and not path.is_symlink():
        return 0
    before = disk_bytes(path) if row.kind != "gguf" else row.size_bytes
    if row.kind == "gguf":
        _delete_hub_file(path)
    elif path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    return before


def _delete_hub_file(pointer: Path) -> None:
    """A .gguf file of a hub snapshot: its blob (when nothing else points at it) and the snapshot's link; the
    repository's folder too when nothing is left in it."""
    blob = pointer.resolve()
    pointer.unlink()
    snapshots = pointer.parent
    while snapshots.name != "snapshots" and snapshots != snapshots.parent:
        snapshots = snapshots.parent
    repo = snapshots.parent
    still = [p for p in snapshots.rglob("*") if p.is_symlink() and p.resolve() == blob]
    if not still and blob.is_file():
        blob.unlink()
    for d in sorted((p for p in snapshots.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(d.iterdir()):
            d.rmdir()
    if not any(p.is_file() for p in (repo / "blobs").glob("*")) and not any(snapshots.rglob("*.gguf")):
        shutil.rmtree(repo, ignore_errors=True)


def age_text(when: Optional[float], now: Optional[float] = None) -> str:
    if when is None:
        return "never"
    seconds = max(0.0, (now or time.time()) - when)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"
