"""The process's memory: what is measured (``measured.py``), how the process holds and returns it (``policy.py``),
and what running out looks like (``oom.py``). What a model will need before it loads is ``estimate/``'s."""
