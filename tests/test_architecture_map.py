"""docs/ARCHITECTURE.md is the map a newcomer reads first: every path it names must exist, and the places a
newcomer looks for first must be named where they are."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "docs" / "ARCHITECTURE.md"
CODE = re.compile(r"`([^`\s]+)`")
SUFFIXES = (".py", ".cpp", ".h", ".md", ".json", ".toml", ".spec", ".txt")


def named_paths(text: str) -> list[str]:
    """Every `code` span that reads as a file or folder of the repository (a path with a slash, or a file name)."""
    found = []
    for token in CODE.findall(text):
        token = token.rstrip(".,:;")
        if token.startswith(("http", "redline.", "$", "-", "~")) or "*" in token or "…" in token:
            continue
        if "/" in token and not token.startswith("/") and re.fullmatch(r"[\w./-]+", token):
            found.append(token)
        elif token.endswith(SUFFIXES) and re.fullmatch(r"[\w.-]+", token):
            found.append(token)
    return found


GENERATED = ("build/", "dist/", ".venv/", "redline/")  # made by `make` or pip, not kept in the repository


def exists(token: str) -> bool:
    if token.startswith(GENERATED):
        return True
    if "/" in token:
        return (ROOT / token).exists()
    return any(ROOT.glob(f"**/{token}"))  # a file named without its folder, in a row that names the folder


def test_every_path_the_map_names_exists():
    names = named_paths(MAP.read_text(encoding="utf-8"))
    assert len(names) > 80  # the check really read the map
    missing = sorted({n for n in names if not exists(n)})
    assert missing == []


def test_the_map_check_catches_a_wrong_path():
    assert named_paths("see `inference/decoding/generate.py` and `x.py`, not `redline.app`") == [
        "inference/decoding/generate.py",
        "x.py",
    ]
    assert not exists("inference/decoding/generate.py")


def test_a_newcomer_finds_the_main_concepts_in_one_guess():
    """The local model, admission, the prompt builder, percentile and the block layout: each named with its file
    in the map's concept table."""
    text = MAP.read_text(encoding="utf-8")
    for concept, path in [
        ("the local model", "inference/backends/local.py"),
        ("admission", "inference/service/admission.py"),
        ("the prompt builder", "inference/generation/request.py"),
        ("percentile", "inference/stats.py"),
        ("block layout", "inference/kernels/block_quant.py"),
    ]:
        rows = [line for line in text.splitlines() if concept in line.lower() and path in line]
        assert rows, f"no line of the map names {concept} with {path}"
        assert (ROOT / path).exists()
