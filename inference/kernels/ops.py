"""The operators the fast decode step calls, each run by the implementation registered for the device type its
tensors live on (ggml's backend registry in miniature).

The table has a row per device type ("cpu", "cuda", …), made at the first operator called for that device. Every
row starts from torch's operators (``reference.py``), which run on any device; the device's backend (``BACKENDS``)
fills in what it does better. The CPU's (``cpu/backend.py``) runs Redline's native kernels where their library
loads and the tensors suit them, and the reference operators otherwise (``REDLINE_NATIVE_KERNELS=0``, a CPU without
a build, no compiler, another dtype). A CUDA or Triton backend is one more module beside ``cpu/`` with an
``operators()`` function, listed in ``BACKENDS``; ``register`` adds or overrides operators for a device from outside
(a test, a plug-in).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from . import reference
from .block_quant import BlockWeights
from .cpu import backend as cpu_backend
from .cpu.library import native  # noqa: F401 - the whole step (native().decode_step) is the CPU library's alone

# The most rows the whole step takes at once (a short prompt read whole, a mixed step's chunk and decode rows):
# from here on a prompt is read operator by operator, whose attention runs through torch.
GEMM_ROWS = 128

OPERATORS = (
    "linear",
    "linear_blocks",
    "rms_norm",
    "silu_mul",
    "attend",
    "bind_linear",
    "bind_blocks",
    "quantize_blocks",
)
# Device type -> its backend: a function returning that device's operators by name (any of OPERATORS), or None
# where none can run in this process. Called once per device type; the CPU's operators ask whether the library runs
# at each call (library.native(), cheap once loaded), so its answer can change under a test that turns it off.
BACKENDS: dict[str, Callable[[], Optional[dict[str, Callable]]]] = {"cpu": cpu_backend.operators}


def _bind_linear(w: torch.Tensor):
    return lambda x: linear(x, w)  # the device's own product, looked up at each call


def _bind_blocks(blocks: BlockWeights):
    return lambda x: linear_blocks(x, blocks)


# Every row starts from these: torch's operators, and products bound to a weight through the row's own product.
_REFERENCE = {
    **{name: getattr(reference, name) for name in OPERATORS if not name.startswith("bind_")},
    "bind_linear": _bind_linear,
    "bind_blocks": _bind_blocks,
}
_registered: dict[str, dict[str, Callable]] = {}  # register()'s, by device type
_table: dict[str, dict[str, Callable]] = {}  # each device type's row, made at its first operator


def register(device_type: str, **operators: Callable) -> None:
    """Run ``operators`` (by name, from OPERATORS) for tensors on ``device_type``, over its backend's and the
    reference ones."""
    unknown = sorted(set(operators) - set(OPERATORS))
    if unknown:
        raise ValueError(f"no operator named {', '.join(unknown)} in the device table; it has {', '.join(OPERATORS)}")
    _registered.setdefault(device_type, {}).update(operators)
    _table.pop(device_type, None)  # the row is made again at the device's next operator


def unregister(device_type: str) -> None:
    """Drop what ``register`` added for ``device_type`` (its backend's and the reference operators stay)."""
    _registered.pop(device_type, None)
    _table.pop(device_type, None)


def implementation(device_type: str, name: str) -> Callable:
    """The function operator ``name`` runs for tensors on ``device_type``."""
    return _row(device_type)[name]


def _row(device_type: str) -> dict[str, Callable]:
    """The device's row, made at its first operator (the operators below look it up in ``_table`` first, inline:
    the per-operator step calls several a layer)."""
    row = _table.get(device_type)
    if row is None:
        row = dict(_REFERENCE)
        backend = BACKENDS.get(device_type)
        if backend is not None:
            row.update(backend() or {})
        row.update(_registered.get(device_type, {}))
        _table[device_type] = row
    return row


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T for a plain weight; on the CPU with the native kernels fp32 activations stay fp32 (bf16 weights are
    read as they are)."""
    t = x.device.type
    return (_table.get(t) or _row(t))["linear"](x, w)


def linear_blocks(x: torch.Tensor, blocks: BlockWeights) -> torch.Tensor:
    t = x.device.type
    return (_table.get(t) or _row(t))["linear_blocks"](x, blocks)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    t = x.device.type
    return (_table.get(t) or _row(t))["rms_norm"](x, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    t = gate_up.device.type
    return (_table.get(t) or _row(t))["silu_mul"](gate_up)


def attend(qkv, cos, sin, k_pool, v_pool, pages, pos, heads: int, kv_heads: int, scale: float) -> torch.Tensor:
    t = qkv.device.type
    return (_table.get(t) or _row(t))["attend"](qkv, cos, sin, k_pool, v_pool, pages, pos, heads, kv_heads, scale)


# -- products bound once to their weights, for the decode step's hot loop (no per-call dispatch) ----------
def bind_linear(w: torch.Tensor):
    """``x ↦ x @ w.T`` with the operator chosen now, for activations on this weight's device."""
    return _row(w.device.type)["bind_linear"](w)


def bind_blocks(blocks: BlockWeights):
    """``x ↦ x @ W.T`` for block-quantised weights, with the operator chosen now for the weights' device."""
    return _row(blocks.qweight.device.type)["bind_blocks"](blocks)


def quantize_blocks(w: torch.Tensor, bits: int, symmetric: bool = False) -> BlockWeights:
    """``block_quant.quantize_q8`` / ``quantize_q4`` — in one parallel pass where the native kernels run."""
    return _row(w.device.type)["quantize_blocks"](w, bits, symmetric)
