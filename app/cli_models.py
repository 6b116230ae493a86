"""`redline models`: the local library (size, last used, prediction, reclaimable leftovers); `models search QUERY`
(the hub, filtered to what Redline runs); `models show REPO` (every variant predicted here before download);
`models pull MODEL` (the starter, a hub id, or `REPO VARIANT`); `models delete NAME` (says the space it frees
first)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..inference import (
    PRIORITIES,
    STARTER_NAME,
    RedlineError,
    age_text,
    default_device,
    delete_local_model,
    delete_text,
    fetch_variant,
    format_bytes,
    legacy_starter_folder,
    local_library,
    machine_target,
    predict_repo,
    reclaimable_bytes,
    repo_variants,
    resolve_auto,
    resolve_model,
    search_hub,
)
from .presets import PresetStore
from .settings import load_settings
from .terminal import TerminalProgress


def add_parser(sub) -> None:
    p = sub.add_parser(
        "models",
        help="list local models; search the hub; show, pull or delete a model",
        description="List the models on this machine (size, last used, what they would run as here) and what can "
        "be reclaimed; search the Hugging Face hub; predict every variant of a repository before downloading it.",
    )
    p.add_argument("--no-predict", action="store_true", help="list without predicting how each would run here")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION")
    search = msub.add_parser("search", help="search the hub for text-generation models Redline can run")
    search.add_argument("query")
    search.add_argument("--sort", choices=("downloads", "trending", "likes"), default="downloads")
    search.add_argument("--limit", type=int, default=20)
    search.add_argument("--kind", choices=("gguf", "safetensors"), default=None)
    search.set_defaults(func=run_search)
    show = msub.add_parser("show", help="every variant of a hub repository, predicted on this machine")
    show.add_argument("repo")
    show.add_argument("--context", type=int, default=None, help="context length to predict for")
    show.add_argument("--priority", choices=PRIORITIES, default=None, help="default: the one in your settings")
    show.set_defaults(func=run_show)
    pull = msub.add_parser("pull", help="fetch a model (`starter`, a hub id, or a repository and its VARIANT)")
    pull.add_argument("model")
    pull.add_argument("variant", nargs="?", help="a variant `models show` lists (Q4_K_M, bf16, …)")
    pull.set_defaults(func=run_pull)
    delete = msub.add_parser("delete", help="delete a model from the library (says the space it frees first)")
    delete.add_argument("name", nargs="?", help="the name `redline models` lists")
    delete.add_argument("--reclaimable", action="store_true", help="delete everything listed as reclaimable")
    delete.add_argument("--yes", "-y", action="store_true", help="do not ask")
    delete.set_defaults(func=run_delete)
    p.set_defaults(func=run_list)


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _priority(args) -> str:
    if getattr(args, "priority", None):
        return args.priority

    return load_settings()[0].priority


def _recent() -> list[str]:

    try:
        return PresetStore().recent_models()
    except Exception:
        return []


def _prediction(model: str, priority: str) -> str:
    """How ``model`` would run here, on one line ("bf16 · 1.2 GB · fits · ≈ 40 tok/s")."""

    try:
        choice = resolve_auto(model, default_device(), priority=priority)
    except RedlineError as exc:
        return str(exc).split(". ")[0]
    except Exception as exc:  # a prediction is a hint: never fail the list over it
        return f"no prediction ({type(exc).__name__})"
    best = next((c for c in choice.candidates if c.precision == choice.precision), None)
    mem = f" · {format_bytes(best.total_bytes)}" if best else ""
    if not choice.fits:
        return f"does not fit here{mem}"
    speed = f" · ≈ {choice.tokens_per_s:.1f} tok/s" if choice.tokens_per_s else ""
    return f"{choice.precision}{mem} · fits{speed}"


def run_list(args) -> int:
    rows = local_library(_recent())
    models = [r for r in rows if not r.reclaimable]
    spare = [r for r in rows if r.reclaimable]
    priority = _priority(args)
    print(f"{'MODEL':<46} {'SIZE':>10}  {'LAST USED':<14} {'HERE' if not args.no_predict else ''}")
    if not any(r.kind == "starter" for r in models):
        print(f"{STARTER_NAME:<46} {'not fetched':>10}  {'never':<14} redline models pull starter")
    for r in models:
        pred = "" if args.no_predict or not r.model else _prediction(r.model, priority)
        print(f"{r.name:<46} {format_bytes(r.size_bytes):>10}  {age_text(r.last_used):<14} {pred}")
        if r.model and r.model != r.name:
            print(f"{'':<46} {'':>10}  use with --model {r.model}")
    if spare:
        print(f"\nReclaimable ({format_bytes(reclaimable_bytes(rows))}; `redline models delete --reclaimable`):")
        for r in spare:
            print(f"  {r.name:<44} {format_bytes(r.size_bytes):>10}  {r.note}")
    old = legacy_starter_folder()
    if old is not None:
        print(
            f"\n{old} ({format_bytes(folder_size(old))}) is an earlier Redline's fp32 copy of the starter; it is "
            "no longer used and can be deleted."
        )
    return 0


def run_search(args) -> int:
    try:
        rows = search_hub(args.query, sort=args.sort, limit=args.limit, kind=args.kind)
    except RedlineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print(f"No text-generation model Redline can run matches {args.query!r}.")
        return 0
    print(f"{'MODEL':<50} {'KIND':<11} {'PARAMS':>8} {'DOWNLOADS':>10}  {'LICENCE':<14} GATED")
    for r in rows:
        params = (
            f"{r.parameters / 1e9:.2f} B"
            if r.parameters and r.parameters >= 1e8
            else (f"{r.parameters / 1e6:.1f} M" if r.parameters else "?")
        )
        print(
            f"{r.repo_id:<50} {r.kind:<11} {params:>8} {r.downloads:>10}  {r.license or '?':<14} "
            f"{'yes' if r.gated else 'no'}"
        )
    print("\nEvery variant predicted here: redline models show REPO")
    return 0


def run_show(args) -> int:
    try:
        target, speed, correction = machine_target()
        rv = repo_variants(args.repo, target.device)
        preds = predict_repo(rv, args.context, _priority(args), target, speed, correction)
    except RedlineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{rv.repo_id} at {rv.commit[:12]} ({rv.kind}{', gated' if rv.gated else ''}); on {target.label}, "
        f"{format_bytes(target.available_bytes)} available; context {preds[0].context if preds else '?'}"
    )
    print(f"{'VARIANT':<10} {'DOWNLOAD':>10} {'MEMORY':>10}  {'FIT':<13} {'TOK/S':>7} {'TTFT':>8}  ")
    for p in preds:
        mem = format_bytes(p.total_bytes) if p.total_bytes else "?"
        tps = f"{p.tokens_per_s:.1f}" if p.tokens_per_s else "?"
        ttft = f"{p.ttft_ms:.0f} ms" if p.ttft_ms else "?"
        mark = f"  ← recommended here: {p.why}" if p.recommended else (f"  ({p.why})" if p.why else "")
        print(f"{p.name:<10} {format_bytes(p.download_bytes):>10} {mem:>10}  {p.fit:<13} {tps:>7} {ttft:>8}{mark}")
    print(f"\nFetch one: redline models pull {rv.repo_id} VARIANT")
    return 0


def run_pull(args) -> int:
    progress = TerminalProgress()
    try:
        if args.variant:
            rv = repo_variants(args.model, default_device())  # the variants this machine offers
            variant = next((v for v in rv.variants if v.name.lower() == args.variant.lower()), None)
            if variant is None:
                names = ", ".join(v.name for v in rv.variants)
                print(f"error: {args.model} has no variant {args.variant!r}; it has: {names}.", file=sys.stderr)
                return 2
            got = fetch_variant(rv, variant, None, progress)
            progress.done()
            print(f"{args.model} {variant.name} is ready: redline chat --model {got.model} --precision {got.precision}")
            return 0
        source = resolve_model(args.model)
        folder = source.prepare(progress)
        progress.done()
    except RedlineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted; what was downloaded is kept and the next pull continues it", file=sys.stderr)
        return 130
    print(f"{source.name} is ready at {folder} ({format_bytes(folder_size(folder))})")
    return 0


def run_delete(args) -> int:
    rows = local_library(_recent())
    if args.reclaimable:
        chosen = [r for r in rows if r.reclaimable]
    else:
        chosen = [r for r in rows if args.name and args.name in (r.name, r.model, str(r.path))]
    if not chosen:
        what = "nothing is reclaimable" if args.reclaimable else f"no model named {args.name!r} in the library"
        print(f"error: {what}; `redline models` lists what is there.", file=sys.stderr)
        return 2
    total = sum(r.size_bytes for r in chosen)
    for r in chosen:
        print(delete_text(r))
    if len(chosen) > 1:
        print(f"In all: {format_bytes(total)}.")
    if not args.yes:
        if not sys.stdin.isatty():
            print("error: not deleted; pass --yes to delete without being asked.", file=sys.stderr)
            return 2
        if input("Delete? [y/N] ").strip().lower() not in ("y", "yes"):
            print("Nothing deleted.")
            return 1
    freed = 0
    for r in chosen:
        try:
            freed += delete_local_model(r)
        except RedlineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print(f"Deleted; {format_bytes(freed)} freed.")
    return 0
