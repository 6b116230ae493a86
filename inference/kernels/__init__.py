"""Redline's compute kernels for the fast decode step.

``ops`` is what the decode step calls: a table of operators by device type, each device's row starting from the
same computations written with torch operators (``reference.py``, also what tests compare the native kernels
against) and filled in by that device's backend. ``cpu/`` is the CPU's: Redline's native kernels, a plain C library
(``cpu/cpu_kernels.cpp``, ``cpu/decode_step.cpp``, built by ``cpu/build.py``, shipped in the wheel and the desktop
bundle, loaded by ``cpu/library.py``). ``block_quant.py`` is the weights' block layout every backend reads.
"""
