"""Files only the user can read: Redline's config and data hold conversations and choices.

Directories are created 0700 and files 0600 on POSIX; writes go to a temporary
file first and are renamed into place, so a crash never leaves half a file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

APP_NAME = "redline"


def private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.chmod(path, 0o700)
    except OSError:
        pass
    return path


def config_dir(create: bool = True) -> Path:
    """Settings, presets and trust decisions (honours XDG_CONFIG_HOME). ``create=False`` only names it."""
    path = Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    return private_dir(path) if create else path


def data_dir(create: bool = True) -> Path:
    """The conversation database and speed-lab runs (honours XDG_DATA_HOME). ``create=False`` only names it."""
    path = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    return private_dir(path) if create else path


def write_private(path: Path, data: bytes | str) -> None:
    """Atomically write ``data`` to ``path`` with mode 0600."""
    private_dir(path.parent)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
