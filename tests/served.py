"""`redline serve` started by a test as a subprocess: the address it prints once it listens."""

import re
import time

ADDRESS = re.compile(r"at (http://127\.0\.0\.1:\d+/v1)")


def read_address(proc, seconds: float) -> tuple[str, list[str]]:
    """The base URL ``proc`` (``redline serve … --port 0``, stderr piped as text) says it serves at, and the lines it
    printed up to then; fails with those lines if it exits or says nothing of the kind within ``seconds``."""
    address, lines = None, []
    deadline = time.monotonic() + seconds
    while address is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = ADDRESS.search(line)
        address = found.group(1) if found else None
    assert address, "".join(lines)
    return address, lines
