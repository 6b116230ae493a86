"""``python -m redline``: the same program as the ``redline`` command."""

from redline.app.cli import main

raise SystemExit(main())
