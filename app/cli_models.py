"""`redline models`: list local models; `redline models pull starter`: fetch the starter."""

from __future__ import annotations

import sys
from pathlib import Path

from redline.app.terminal import TerminalProgress
from redline.inference import (
    STARTER_NAME,
    RedlineError,
    format_bytes,
    is_converted,
    legacy_starter_folder,
    models_dir,
    resolve_model,
    starter_folder,
)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "models",
        help="list local models, or pull the starter",
        description="List the starter and the models available on this machine, with size on disk.",
    )
    msub = p.add_subparsers(dest="models_command", metavar="ACTION")
    pull = msub.add_parser("pull", help="fetch a model (e.g. `starter`) into the local cache")
    pull.add_argument("model")
    pull.set_defaults(func=run_pull)
    p.set_defaults(func=run_list)


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def local_models() -> list[tuple[str, str, Path | None, int | None]]:
    """(name, how to pass it, folder, size) for the starter, converted GGUFs and the HF cache."""
    rows = []
    sf = starter_folder()
    rows.append(
        (STARTER_NAME, "starter", sf if is_converted(sf) else None, folder_size(sf) if is_converted(sf) else None)
    )
    gguf_root = models_dir() / "gguf"
    if gguf_root.is_dir():
        for folder in sorted(gguf_root.iterdir()):
            if is_converted(folder):
                rows.append(
                    (folder.name, "(converted GGUF: pass the original .gguf path)", folder, folder_size(folder))
                )
    try:
        from huggingface_hub import scan_cache_dir

        for repo in sorted(scan_cache_dir().repos, key=lambda r: r.repo_id):
            if repo.repo_type == "model":
                rows.append((repo.repo_id, repo.repo_id, Path(repo.repo_path), repo.size_on_disk))
    except Exception:
        pass  # no HF cache yet
    return rows


def run_list(args) -> int:
    rows = local_models()
    print(f"{'MODEL':<40} {'SIZE':>10}  USE WITH --model")
    for name, how, _folder, size in rows:
        size_text = format_bytes(size) if size is not None else "not fetched"
        print(f"{name:<40} {size_text:>10}  {how}")
    if rows[0][2] is None:
        print("\nThe starter is fetched on first use, or now with: redline models pull starter")
    old = legacy_starter_folder()
    if old is not None:
        print(
            f"\n{old} ({format_bytes(folder_size(old))}) is an earlier Redline's fp32 copy of the starter; it is "
            "no longer used and can be deleted."
        )
    return 0


def run_pull(args) -> int:
    try:
        source = resolve_model(args.model)
        progress = TerminalProgress()
        folder = source.prepare(progress)
        progress.done()
    except RedlineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted; nothing half-written was kept", file=sys.stderr)
        return 130
    print(f"{source.name} is ready at {folder} ({format_bytes(folder_size(folder))})")
    return 0
