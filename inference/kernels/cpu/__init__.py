"""The CPU backend: Redline's native CPU kernels.

- ``cpu_kernels.cpp`` (one operator per call) and ``decode_step.cpp`` (a whole decode step in one call), on the
  headers ``abi.h`` (the C ABI), ``vec.h`` (each CPU family's vector operations), ``simd.h`` (the shared building
  blocks), ``paged_attention.h`` and ``arch/avx512.h`` (the avx512-vnni build's own tiles);
- ``build.py``: the compile recipe, one library per CPU family (variant), for the wheel, the bundle and a source
  checkout's first-use build;
- ``library.py``: which variant this CPU runs, where its library is (shipped, cached, built now), loading it once,
  and its status for people;
- ``abi.py``: the C functions' signatures for ctypes; ``wrappers.py``: the Python functions that call them;
  ``torch_ops.py``: the same as ``torch.ops.redline.*``;
- ``backend.py``: the CPU's row of the device table (``kernels/ops.py``).

Nothing here imports torch at import time except ``backend.py`` and ``torch_ops.py``: ``cost.py`` asks
``library.will_run()`` without it.
"""
