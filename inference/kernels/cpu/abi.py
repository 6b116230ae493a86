"""The kernel library's C ABI (``abi.h``) as ctypes sees it: each exported function's argument types, the tensor
description ``redline_step_plan`` reads, the dtype codes, and opening a library file with its ABI version and
variant checked. ``wrappers.py`` calls these functions; ``library.py`` decides which file to open."""

from __future__ import annotations

import ctypes
from pathlib import Path

from .build import ABI_VERSION

_P, _I, _D, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int


class RedlineTensor(ctypes.Structure):  # decode_step.cpp's redline_tensor
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int64),
        ("ndim", ctypes.c_int64),
        ("numel", ctypes.c_int64),
        ("contiguous", ctypes.c_int64),
        ("sizes", ctypes.c_int64 * 2),
        ("strides", ctypes.c_int64 * 2),
    ]


SIGNATURES = {
    "redline_linear_bf16": [_P, _I, _I, _P, _I, _I, _P, _INT],
    "redline_linear_q8": [_P, _I, _I, _P, _P, _I, _P, _INT],
    "redline_linear_q4": [_P, _I, _I, _P, _P, _P, _I, _P, _INT],
    "redline_rms_norm": [_P, _I, _I, _P, _D, _P],
    "redline_silu_mul": [_P, _I, _I, _P],
    "redline_attend": [_P, _P, _P, _P, _P, _I, _P, _I, _P, _I, _I, _I, _I, _I, _D, _P, _INT],
    "redline_quantize_q8": [_P, _I, _I, _I, _P, _P, _INT],
    "redline_quantize_q4": [_P, _I, _I, _I, _INT, _P, _P, _P, _INT],
    "redline_step_plan": [
        ctypes.POINTER(RedlineTensor),
        _I,
        ctypes.POINTER(RedlineTensor),
        _I,
        ctypes.POINTER(_D),
        _I,
        _I,
        _I,
        _I,
        ctypes.POINTER(_I),
    ],
    "redline_drop_plan": [_I],
    "redline_decode_step": [
        _P,
        _I,
        _I,
        _I,
        _I,
        _P,
        _P,
        _I,
        _P,
        _P,
        _I,
        _I,
        _I,
        _I,
        _I,
        _I,
        _I,
        _I,
        _P,
        _I,
        _I,
        _P,
        _I,
        _D,
        _I,
        _P,
        _INT,
    ],
    "redline_step_profile": [_INT, ctypes.POINTER(_D)],
}


def declare(lib) -> None:
    """Give ``lib``'s functions their argument types (ctypes then converts and checks each call's arguments)."""
    for name, args in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int
    lib.redline_last_error.restype = ctypes.c_char_p


def dtype_codes():
    """torch dtype -> the code abi.h gives it (7: any other)."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    return {
        torch.float32: 0,
        torch.bfloat16: 1,
        torch.float16: 2,
        torch.int8: 3,
        torch.uint8: 4,
        torch.int32: 5,
        torch.int64: 6,
    }


def open_library(path: Path, variant: str):
    """The library at ``path`` with its functions declared; RuntimeError if it is another ABI version or another
    variant than ``variant`` (a stale cache entry or a misnamed file)."""
    lib = ctypes.CDLL(str(path))
    version = lib.redline_abi_version()
    if version != ABI_VERSION:
        raise RuntimeError(f"{path.name} has ABI version {version}, this Redline needs {ABI_VERSION}")
    lib.redline_variant.restype = ctypes.c_char_p
    built_as = lib.redline_variant().decode()
    if built_as != variant:
        raise RuntimeError(f"{path.name} is the {built_as} build, not {variant}")
    declare(lib)
    return lib
