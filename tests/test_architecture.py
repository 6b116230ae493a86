"""The layer contracts are checked by `make test`; this proves they actually catch a violation."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def copy_tree(tmp_path: Path) -> Path:
    """A copy of the checkout's packages in a folder named ``redline`` (the checkout root is the package)."""
    pkg = tmp_path / "redline"
    for name in ("app", "ui", "inference", "assets"):
        shutil.copytree(ROOT / name, pkg / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("__init__.py", "__main__.py", "pyproject.toml"):
        shutil.copy(ROOT / name, pkg / name)
    return pkg


def lint(pkg: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(exe), "--config", str(pkg / "pyproject.toml"), "--no-cache"],
        cwd=pkg.parent,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(pkg.parent), "PATH": ""},
    )


def test_contract_breaks_when_engine_imports_qt(tmp_path):
    pkg = copy_tree(tmp_path)
    assert lint(pkg).returncode == 0, lint(pkg).stdout
    (pkg / "inference" / "sneaky.py").write_text("import PySide6\n")
    broken = lint(pkg)
    assert broken.returncode != 0
    assert "redline.inference.sneaky -> PySide6" in broken.stdout


def test_contract_breaks_when_ui_reaches_past_the_public_surface(tmp_path):
    pkg = copy_tree(tmp_path)
    (pkg / "ui" / "sneaky.py").write_text("from redline.inference.decoding.fastpath import FastDecoder\n")
    broken = lint(pkg)
    assert broken.returncode != 0
    assert "redline.ui.sneaky -> redline.inference.decoding.fastpath" in broken.stdout


def test_contract_breaks_when_the_engine_reaches_up_into_the_service(tmp_path):
    """The batcher, requests and their preparation are the engine's: nothing in it may import the service."""
    pkg = copy_tree(tmp_path)
    (pkg / "inference" / "generation" / "sneaky.py").write_text("from redline.inference.service import scheduler\n")
    broken = lint(pkg)
    assert broken.returncode != 0
    assert "redline.inference.generation.sneaky -> redline.inference.service" in broken.stdout


def test_contract_breaks_when_a_lower_layer_of_the_engine_imports_a_higher_one(tmp_path):
    """Inside the engine imports go one way: the kernels (low) must not reach the backends (high)."""
    pkg = copy_tree(tmp_path)
    (pkg / "inference" / "kernels" / "sneaky.py").write_text("from ..backends import local\n")
    broken = lint(pkg)
    assert broken.returncode != 0
    assert "Inside the engine, one direction BROKEN" in broken.stdout
    assert "redline.inference.kernels.sneaky -> redline.inference.backends.local" in broken.stdout


def subpackage_graph(exclude: str = "") -> dict[str, set[str]]:
    """inference's parts (subpackages and top-level modules) and which others each imports (type-only imports
    left out: they do not run)."""
    import grimp

    graph = grimp.build_graph("redline", exclude_type_checking_imports=True, cache_dir=None)
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        parts = module.split(".")
        if len(parts) < 3 or parts[1] != "inference" or module == exclude:
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            other = imported.split(".")
            if len(other) >= 3 and other[1] == "inference" and other[2] != parts[2] and imported != exclude:
                edges.setdefault(parts[2], set()).add(other[2])
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more parts (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_the_engines_parts():
    edges = subpackage_graph()
    assert {"backends", "kernels", "loading", "generation"} <= set(edges)  # the graph was really read
    assert cycles(edges) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


PACKAGE_FOLDERS = ("app", "ui", "inference")


def test_the_package_imports_itself_relatively_and_tests_and_tools_absolutely():
    """Inside the package every import of its own modules is relative, so tools that read paths see the layers;
    tests and tools import ``redline`` by name, as a user's program would."""
    import ast

    def imports(path: Path) -> list[tuple[int, str]]:
        """(level, module) of every import in ``path``: level 0 is absolute."""
        found = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                found.append((node.level, node.module or ""))
            elif isinstance(node, ast.Import):
                found += [(0, alias.name) for alias in node.names]
        return found

    def own_absolute(path: Path) -> bool:
        return any(level == 0 and (m == "redline" or m.startswith("redline.")) for level, m in imports(path))

    files = [ROOT / "__init__.py", ROOT / "__main__.py"]
    files += [p for folder in PACKAGE_FOLDERS for p in (ROOT / folder).rglob("*.py")]
    assert [str(p.relative_to(ROOT)) for p in files if own_absolute(p)] == []
    assert any(level > 0 for level, _ in imports(ROOT / "inference" / "engine.py"))  # the check reads imports
    outside = [p for folder in ("tests", "tools") for p in (ROOT / folder).rglob("*.py")]
    assert any(own_absolute(p) for p in outside)
    assert [str(p.relative_to(ROOT)) for p in outside if any(level for level, _ in imports(p))] == []


def test_the_public_surface_imports_neither_torch_nor_transformers():
    """The window imports the engine's surface on the UI thread; torch must load on the engine's thread."""
    code = (
        "import sys, redline.inference, redline.ui.window.main_window, redline.app.gui; "
        "print(sorted(m for m in ('torch', 'transformers', 'bitsandbytes') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_command_line_loads_neither_qt_nor_torch_until_a_command_needs_them():
    """`redline serve`, `redline chat` and the rest run where Qt is missing (a server, the GPU machine): importing
    the command line loads no Qt library and no torch (the window's and the engine's imports stay in their paths)."""
    heavy = ("PySide6.QtWidgets", "PySide6.QtGui", "qasync", "pyqtgraph", "torch", "transformers")
    code = f"import sys, redline.app.cli; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_ui_and_app_cite_no_document_outside_the_repository():
    """User-facing text and comments say what a thing is, not where some document outside the repository
    described it ("the seed document", "seed §5.1", "the design notes")."""
    import re

    cited = re.compile(r"seed (document|doc\b|§)|§\s*\d|design notes", re.IGNORECASE)
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in ("ui", "app")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if cited.search(line)
    ]
    assert hits == []


def function_local_imports_without_a_reason(source: str) -> list[int]:
    """Line numbers of the imports inside a function of ``source`` that give no reason to be there: one needs a
    comment on its own line, or a ``# lazy: …`` line above the block of imports it belongs to. Imports under
    ``if TYPE_CHECKING`` never run, so they need none."""
    import ast

    tree, lines = ast.parse(source), source.splitlines()
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def inside(node, kinds) -> bool:
        while node in parents:
            node = parents[node]
            if isinstance(node, kinds) or (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
                return not isinstance(node, ast.If)
        return False

    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    import_lines = {line for n in imports for line in range(n.lineno, n.end_lineno + 1)}

    def says_why(node) -> bool:
        if "#" in lines[node.lineno - 1]:
            return True
        above = node.lineno - 1  # up through the block of imports it belongs to (no blank line between)
        while above in import_lines:
            above -= 1
        return above >= 1 and lines[above - 1].strip().startswith("# lazy")

    local = [n for n in imports if inside(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return sorted(n.lineno for n in local if not says_why(n))


def test_every_import_inside_a_function_says_why_it_is_there():
    """A function-local import is there for a reason (torch must load on the engine's thread, Qt only for the
    window, a library that may be missing, a module that imports this one): the reason is written beside it, so
    an import that only hides a cycle or saves a line shows up here and moves to the top of its module."""
    unexplained = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in PACKAGE_FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line in function_local_imports_without_a_reason(path.read_text(encoding="utf-8"))
    ]
    assert unexplained == []


def test_the_import_reason_check_finds_an_unexplained_import():
    source = (
        "import os\n\n"
        "def f():\n"
        "    # lazy: torch loads on the engine's thread, never at import\n"
        "    import torch\n"
        "    from torch import nn\n\n"
        "    import json\n"
        "    return torch, nn, json\n\n"
        "def g():\n"
        "    import re  # a comment of its own\n"
        "    if TYPE_CHECKING:\n"
        "        import typing\n"
        "    return re\n"
    )
    assert function_local_imports_without_a_reason(source) == [8]
