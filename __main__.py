"""``python -m redline``: the same program as the ``redline`` command."""

from .app.cli import main

raise SystemExit(main())
