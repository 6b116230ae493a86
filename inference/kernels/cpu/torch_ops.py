"""The kernels registered as torch operators, ``torch.ops.redline.*`` (``torch.library.custom_op``): what a
torch.compile'd step calls (their fake implementations here give their shapes) and what code outside
``redline.inference.kernels`` may call. Eager code inside Redline calls the same functions straight through ctypes
(``wrappers.Kernels``): a custom operator's dispatch costs several microseconds more per call (see
docs/performance.md).

No ``from __future__ import annotations`` here: custom_op reads the annotations as types.
"""

import torch
from torch import Tensor


def register(k) -> None:
    """Register ``k``'s operators (a wrappers.Kernels) under ``redline::``, and their shapes (``register_fakes``)."""

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

    register_fakes()


def register_fakes() -> None:
    """Shapes of the native operators' outputs, so torch.compile can trace a step that calls them."""

    def rows(x, n):
        return x.new_empty((*x.shape[:-1], n), dtype=torch.float32)

    torch.library.register_fake("redline::linear_bf16")(lambda x, w: rows(x, w.shape[0]))
    torch.library.register_fake("redline::linear_q8")(lambda x, w, s: rows(x, w.shape[0]))
    torch.library.register_fake("redline::linear_q4")(lambda x, w, s, m: rows(x, w.shape[0]))
    torch.library.register_fake("redline::rms_norm")(lambda x, w, eps: torch.empty_like(x))
    torch.library.register_fake("redline::silu_mul")(lambda g: g.new_empty((*g.shape[:-1], g.shape[-1] // 2)))
    torch.library.register_fake("redline::attend")(
        lambda qkv, cos, sin, kp, vp, pages, pos, h, hkv, scale: qkv.new_empty((pos.shape[0], h * kp.shape[-1]))
    )
    torch.library.register_fake("redline::decode_step")(
        lambda x, plan, vocab, cos, sin, kp, vp, pages, pos, scale, rows: x.new_empty((rows, vocab))
    )
