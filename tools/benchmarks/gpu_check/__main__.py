"""``python tools/benchmarks/gpu_check``: the folder runs as a script (see ``__init__``'s docstring).

tools/ is not a package: its parent goes on the path so the modules import as ``gpu_check.*``. Where ``redline``
is not installed (a bare GPU machine: the wheels carried, no editable install), it is imported from this checkout
through a link named ``redline`` to the repository root in a temporary folder (the root is the package)."""

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # the folder itself is not a package root
sys.path.insert(0, str(HERE.parent))


def _redline_importable() -> None:
    try:
        import redline  # noqa: F401 - only whether it imports
    except ImportError:
        link = Path(tempfile.mkdtemp(prefix="redline-src-")) / "redline"
        os.symlink(HERE.parents[2], link)
        sys.path.insert(0, str(link.parent))


_redline_importable()

from gpu_check.run import entry  # noqa: E402 - after the path is set

entry()
