"""Entry script of the PyInstaller bundle: the same `redline` command the wheel installs."""

import multiprocessing
import os

if __name__ == "__main__":
    multiprocessing.freeze_support()
    # torch.compile's worker pool re-launches sys.executable, which in a bundle is Redline itself:
    # compile in-process instead.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    from redline.app.cli import main

    raise SystemExit(main())
