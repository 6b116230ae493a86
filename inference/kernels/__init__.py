"""Redline's compute kernels for the fast decode step.

``ops`` is what the decode step calls: each operator runs Redline's native CPU kernel (a plain C library built
from ``cpu_kernels.cpp`` and ``decode_step.cpp`` by ``build.py``, shipped in the wheel and the desktop bundle,
loaded by ``native.py``) when it is available and the tensors live on the CPU, and otherwise the same
computation written with torch operators (``reference.py``), which is also what tests compare the native kernels
against.
"""
