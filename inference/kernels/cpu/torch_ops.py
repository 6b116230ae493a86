"""The kernels registered as torch operators, ``torch.ops.redline.*`` (``torch.library.custom_op``): what a
torch.compile'd step calls (native.register_fakes gives their shapes) and what code outside ``redline.inference.
kernels`` may call. Eager code inside Redline calls the same functions straight through ctypes (``native.Kernels``):
a custom operator's dispatch costs several microseconds more per call (see docs/performance.md).

No ``from __future__ import annotations`` here: custom_op reads the annotations as types.
"""

import torch
from torch import Tensor


def register(k) -> None:
    """Register ``k``'s operators (a native.Kernels) under ``redline::``."""

    def op(name, mutates=(), devices="cpu"):
        return torch.library.custom_op(f"redline::{name}", mutates_args=mutates, device_types=devices)

    @op("linear_bf16")
    def linear_bf16(x: Tensor, w: Tensor) -> Tensor:
        return k.linear_bf16(x, w)

    @op("linear_q8")
    def linear_q8(x: Tensor, w: Tensor, scales: Tensor) -> Tensor:
        return k.linear_q8(x, w, scales)

    @op("linear_q4")
    def linear_q4(x: Tensor, w: Tensor, scales: Tensor, mins: Tensor) -> Tensor:
        return k.linear_q4(x, w, scales, mins)

    @op("rms_norm")
    def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        return k.rms_norm(x, weight, eps)

    @op("silu_mul")
    def silu_mul(gate_up: Tensor) -> Tensor:
        return k.silu_mul(gate_up)

    @op("quantize_q8")
    def quantize_q8(w: Tensor) -> tuple[Tensor, Tensor]:
        return k.quantize_q8(w)

    @op("quantize_q4")
    def quantize_q4(w: Tensor, symmetric: bool) -> tuple[Tensor, Tensor, Tensor]:
        return k.quantize_q4(w, symmetric)

    @op("attend", mutates=("k_pool", "v_pool"))
    def attend(
        qkv: Tensor,
        cos: Tensor,
        sin: Tensor,
        k_pool: Tensor,
        v_pool: Tensor,
        pages: Tensor,
        pos: Tensor,
        H: int,
        Hkv: int,
        scale: float,
    ) -> Tensor:
        return k.attend(qkv, cos, sin, k_pool, v_pool, pages, pos, H, Hkv, scale)

    @op("step_plan", devices=None)
    def step_plan(layers: list[Tensor], head: list[Tensor], eps: list[float], H: int, Hkv: int, D: int) -> int:
        return k.step_plan(layers, head, eps, H, Hkv, D)

    @op("drop_plan", devices=None)
    def drop_plan(plan: int) -> None:
        k.drop_plan(plan)

    @op("decode_step", mutates=("k_pool", "v_pool"))
    def decode_step(
        x: Tensor,
        plan: int,
        vocab: int,
        cos: Tensor,
        sin: Tensor,
        k_pool: Tensor,
        v_pool: Tensor,
        pages: Tensor,
        pos: Tensor,
        scale: float,
        logit_rows: int,
    ) -> Tensor:
        return k.decode_step(x, plan, vocab, cos, sin, k_pool, v_pool, pages, pos, scale, logit_rows)

    @op("step_profile", devices=None)
    def step_profile(enable: bool) -> Tensor:
        return k.step_profile(enable)
