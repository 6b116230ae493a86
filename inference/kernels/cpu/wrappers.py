"""The kernels as Python functions (``Kernels``): each checks what the C side cannot see (types, layouts), makes
its output tensor and calls the library through ctypes (``abi.py``); while torch.compile traces, each calls the
registered ``torch.ops.redline.*`` operator instead (``torch_ops.py``), so the graph holds the operator.
``library.native()`` returns the loaded library's ``Kernels``; ``backend.py`` puts them in the device table."""

from __future__ import annotations

import ctypes

from .abi import RedlineTensor, dtype_codes


class Kernels:
    """The operators, called straight through ctypes in eager code (about what a torch extension's dispatch costs),
    and as the registered ``torch.ops.redline.*`` while torch.compile traces (so the graph holds the operator).
    Each checks what the C side cannot see (types, layouts) and raises RuntimeError as the operators did."""

    def __init__(self, lib):
        # lazy: torch loads on the engine's thread, never at import
        import torch

        self._lib = lib
        self._torch = torch
        self._codes = dtype_codes()
        self._f32 = torch.float32
        self._threads = torch.get_num_threads
        self._compiling_fn = torch.compiler.is_compiling
        self._plans: dict[int, tuple] = {}  # plan id -> the tensors its pointers point into

    # helpers ----------------------------------------------------------------------------------------------------
    def _fail(self, rc: int) -> None:
        if rc:
            raise RuntimeError(self._lib.redline_last_error().decode(errors="replace"))

    def _rows(self, x, K: int, what: str):
        if x.shape[-1] != K:
            raise RuntimeError(f"redline kernels: input has {x.shape[-1]} features, the {what} {K}")
        torch = self._torch
        x2 = x if x.dtype == torch.float32 else x.to(torch.float32)
        return x2.contiguous().view(-1, K)

    @staticmethod
    def _compiling() -> bool:
        # lazy: torch loads on the engine's thread, never at import
        import torch

        return torch.compiler.is_compiling()

    # the operators ----------------------------------------------------------------------------------------------
    def linear_bf16(self, x, w):
        """y = x @ w.T for bf16 weights [N, K] with rows (stride(1) == 1), fp32 activations; y is fp32."""
        torch = self._torch
        if torch.compiler.is_compiling():
            return torch.ops.redline.linear_bf16(x, w)
        if w.dtype != torch.bfloat16 or w.dim() != 2 or w.stride(1) != 1:
            raise RuntimeError("redline::linear_bf16: the weight must be bf16 [N, K] with contiguous rows")
        N, K = w.shape
        x2 = self._rows(x, K, "weight")
        T = x2.shape[0]
        y = torch.empty((T, N), dtype=torch.float32)
        self._fail(
            self._lib.redline_linear_bf16(
                x2.data_ptr(), T, K, w.data_ptr(), N, w.stride(0), y.data_ptr(), torch.get_num_threads()
            )
        )
        return y.view(*x.shape[:-1], N)

    def linear_q8(self, x, w, scales):
        torch = self._torch
        if torch.compiler.is_compiling():
            return torch.ops.redline.linear_q8(x, w, scales)
        if (
            w.dtype != torch.int8
            or not w.is_contiguous()
            or scales.dtype != torch.float16
            or not scales.is_contiguous()
        ):
            raise RuntimeError("redline::linear_q8: int8 [N, K] blocks with contiguous fp16 scales")
        N, K = w.shape
        x2 = self._rows(x, K, "weight")
        T = x2.shape[0]
        y = torch.empty((T, N), dtype=torch.float32)
        self._fail(
            self._lib.redline_linear_q8(
                x2.data_ptr(), T, K, w.data_ptr(), scales.data_ptr(), N, y.data_ptr(), torch.get_num_threads()
            )
        )
        return y.view(*x.shape[:-1], N)

    def linear_q4(self, x, w, scales, mins):
        torch = self._torch
        if torch.compiler.is_compiling():
            return torch.ops.redline.linear_q4(x, w, scales, mins)
        if (
            w.dtype != torch.uint8
            or not w.is_contiguous()
            or scales.dtype != torch.float16
            or not scales.is_contiguous()
        ):
            raise RuntimeError("redline::linear_q4: uint8 [N, K/2] blocks with contiguous fp16 scales")
        if mins.numel() and (mins.dtype != torch.float16 or not mins.is_contiguous() or mins.shape != scales.shape):
            raise RuntimeError("redline::linear_q4: the mins must be contiguous fp16 shaped as the scales")
        N, K = w.shape[0], w.shape[1] * 2
        x2 = self._rows(x, K, "weight")
        T = x2.shape[0]
        y = torch.empty((T, N), dtype=torch.float32)
        self._fail(
            self._lib.redline_linear_q4(
                x2.data_ptr(),
                T,
                K,
                w.data_ptr(),
                scales.data_ptr(),
                mins.data_ptr() if mins.numel() else None,
                N,
                y.data_ptr(),
                torch.get_num_threads(),
            )
        )
        return y.view(*x.shape[:-1], N)

    def rms_norm(self, x, weight, eps: float):
        if self._compiling_fn():
            return self._torch.ops.redline.rms_norm(x, weight, eps)
        f32, H = self._f32, x.shape[-1]
        if weight.dtype is not f32 or weight.numel() != H:
            raise RuntimeError(f"redline::rms_norm: the weight must be fp32 [{H}]")
        if x.dtype is not f32 or not x.is_contiguous():
            x = x.to(f32).contiguous()
        w = weight if weight.is_contiguous() else weight.contiguous()
        y = self._torch.empty_like(x)
        rc = self._lib.redline_rms_norm(x.data_ptr(), x.numel() // H, H, w.data_ptr(), eps, y.data_ptr())
        if rc:
            self._fail(rc)
        return y

    def silu_mul(self, gate_up):
        if self._compiling_fn():
            return self._torch.ops.redline.silu_mul(gate_up)
        f32, I2 = self._f32, gate_up.shape[-1]
        g = gate_up if gate_up.dtype is f32 and gate_up.is_contiguous() else gate_up.to(f32).contiguous()
        rows = g.numel() // I2
        y = self._torch.empty((*g.shape[:-1], I2 // 2), dtype=f32)
        rc = self._lib.redline_silu_mul(g.data_ptr(), rows, I2 // 2, y.data_ptr())
        if rc:
            self._fail(rc)
        return y

    def attend(self, qkv, cos, sin, k_pool, v_pool, pages, pos, H: int, Hkv: int, scale: float):
        torch = self._torch
        if torch.compiler.is_compiling():
            return torch.ops.redline.attend(qkv, cos, sin, k_pool, v_pool, pages, pos, H, Hkv, scale)
        page, D, B = k_pool.shape[2], k_pool.shape[3], pos.shape[0]
        if k_pool.dtype == torch.int8:  # 8-bit rows: D int8 and an fp16 scale (kernels/kv_quant.py)
            D -= 2
        if not (k_pool.is_contiguous() and v_pool.is_contiguous() and k_pool.dtype == v_pool.dtype):
            raise RuntimeError("redline::attend: the KV pools must be contiguous and of one type")
        if pages.dtype != torch.int32 or pos.dtype != torch.int64 or cos.dtype != torch.float32:
            raise RuntimeError("redline::attend: pages int32, pos int64, cos/sin fp32")
        code = self._codes.get(k_pool.dtype, 7)
        if code not in (0, 1, 3):
            raise RuntimeError("redline::attend: the KV cache must be fp32, bf16 or 8-bit rows (int8)")
        q = self._rows(qkv, (H + 2 * Hkv) * D, "heads")
        c, s, pg, ps = cos.contiguous(), sin.contiguous(), pages.contiguous(), pos.contiguous()
        out = torch.empty((B, H * D), dtype=torch.float32)
        self._fail(
            self._lib.redline_attend(
                q.data_ptr(),
                c.data_ptr(),
                s.data_ptr(),
                k_pool.data_ptr(),
                v_pool.data_ptr(),
                code,
                pg.data_ptr(),
                pg.shape[1],
                ps.data_ptr(),
                B,
                H,
                Hkv,
                D,
                page,
                scale,
                out.data_ptr(),
                torch.get_num_threads(),
            )
        )
        return out

    def quantize_q8(self, w_):
        torch = self._torch
        w = w_.contiguous() if w_.dtype == torch.bfloat16 else w_.to(torch.float32).contiguous()
        N, K = w.shape
        q = torch.empty((N, K), dtype=torch.int8)
        sc = torch.empty((N, K // 32), dtype=torch.float16)
        code = self._codes[w.dtype]
        self._fail(
            self._lib.redline_quantize_q8(
                w.data_ptr(), code, N, K, q.data_ptr(), sc.data_ptr(), torch.get_num_threads()
            )
        )
        return q, sc

    def quantize_q4(self, w_, symmetric: bool):
        torch = self._torch
        w = w_.contiguous() if w_.dtype == torch.bfloat16 else w_.to(torch.float32).contiguous()
        N, K = w.shape
        packed = torch.empty((N, K // 2), dtype=torch.uint8)
        sc = torch.empty((N, K // 32), dtype=torch.float16)
        mn = torch.empty((0,), dtype=torch.float16) if symmetric else torch.empty((N, K // 32), dtype=torch.float16)
        self._fail(
            self._lib.redline_quantize_q4(
                w.data_ptr(),
                self._codes[w.dtype],
                N,
                K,
                int(bool(symmetric)),
                packed.data_ptr(),
                sc.data_ptr(),
                mn.data_ptr() if not symmetric else None,
                torch.get_num_threads(),
            )
        )
        return packed, sc, mn

    # products bound once to their weight: everything about the weight resolved now, the least per call (the
    # per-operator step calls about six a layer) ---------------------------------------------------------------
    def _bound(self, op_name: str, fn, K: int, N: int, weight_args: tuple, op_args: tuple):
        torch, f32, empty, threads, compiling, fail = (
            self._torch,
            self._f32,
            self._torch.empty,
            self._threads,
            self._compiling_fn,
            self._fail,
        )

        def product(x):
            if compiling():
                return getattr(torch.ops.redline, op_name)(x, *op_args)
            if x.dtype is not f32 or not x.is_contiguous():
                x = x.to(f32).contiguous()
            if x.shape[-1] != K:
                raise RuntimeError(f"redline kernels: input has {x.shape[-1]} features, the weight {K}")
            T = x.numel() // K
            y = empty((T, N), dtype=f32)
            rc = fn(x.data_ptr(), T, K, *weight_args, y.data_ptr(), threads())
            if rc:
                fail(rc)
            return y if x.dim() == 2 else y.view(*x.shape[:-1], N)

        product.keep = op_args  # the tensors the pointers point into
        return product

    def bind_bf16(self, w):
        """``x ↦ x @ w.T`` for one bf16 weight [N, K] with rows; fp32 out."""
        if w.dtype != self._torch.bfloat16 or w.dim() != 2 or w.stride(1) != 1 or w.shape[1] % 8:
            raise RuntimeError("redline::linear_bf16: the weight must be bf16 [N, K] with rows, K a multiple of 8")
        N, K = w.shape
        return self._bound("linear_bf16", self._lib.redline_linear_bf16, K, N, (w.data_ptr(), N, w.stride(0)), (w,))

    def bind_q8(self, w, scales):
        if w.dtype != self._torch.int8 or not w.is_contiguous() or scales.dtype != self._torch.float16:
            raise RuntimeError("redline::linear_q8: int8 [N, K] blocks with fp16 scales")
        scales = scales.contiguous()
        N, K = w.shape
        return self._bound(
            "linear_q8", self._lib.redline_linear_q8, K, N, (w.data_ptr(), scales.data_ptr(), N), (w, scales)
        )

    def bind_q4(self, w, scales, mins):
        if w.dtype != self._torch.uint8 or not w.is_contiguous() or scales.dtype != self._torch.float16:
            raise RuntimeError("redline::linear_q4: uint8 [N, K/2] blocks with fp16 scales")
        scales, mins = scales.contiguous(), mins.contiguous()
        N, K = w.shape[0], w.shape[1] * 2
        mp = mins.data_ptr() if mins.numel() else None
        return self._bound(
            "linear_q4", self._lib.redline_linear_q4, K, N, (w.data_ptr(), scales.data_ptr(), mp, N), (w, scales, mins)
        )

    # the whole step -------------------------------------------------------------------------------------------
    def _describe(self, t) -> RedlineTensor:
        d = RedlineTensor()
        d.data = t.data_ptr() if t.numel() else None
        d.dtype = self._codes.get(t.dtype, 7)
        d.ndim = t.dim()
        d.numel = t.numel()
        d.contiguous = int(t.is_contiguous())
        for i in range(min(2, t.dim())):
            d.sizes[i] = t.shape[i]
            d.strides[i] = t.stride(i)
        return d

    def step_plan(self, layers, head, eps, H: int, Hkv: int, D: int) -> int:
        """Check and resolve one model's weights for ``decode_step`` (decode_step.cpp's ``redline_step_plan``);
        the plan keeps the tensors alive until ``drop_plan``."""
        layers, head = list(layers), list(head)
        ls = (RedlineTensor * max(1, len(layers)))(*[self._describe(t) for t in layers])
        hs = (RedlineTensor * max(1, len(head)))(*[self._describe(t) for t in head])
        es = (ctypes.c_double * max(1, len(eps)))(*[float(e) for e in eps])
        plan = ctypes.c_int64(0)
        self._fail(
            self._lib.redline_step_plan(ls, len(layers), hs, len(head), es, len(eps), H, Hkv, D, ctypes.byref(plan))
        )
        self._plans[plan.value] = (layers, head)
        return plan.value

    def drop_plan(self, plan: int) -> None:
        self._lib.redline_drop_plan(plan)
        self._plans.pop(plan, None)

    def decode_step(
        self, x, plan: int, vocab: int, cos, sin, k_pool, v_pool, pages, pos, scale: float, logit_rows: int
    ):
        torch = self._torch
        if torch.compiler.is_compiling():
            return torch.ops.redline.decode_step(
                x, plan, vocab, cos, sin, k_pool, v_pool, pages, pos, scale, logit_rows
            )
        x_ok = x.dim() == 2 and x.dtype == torch.float32
        xc = x.contiguous() if x_ok else x
        pools_ok = (
            k_pool.dim() == 5
            and k_pool.is_contiguous()
            and v_pool.is_contiguous()
            and k_pool.shape == v_pool.shape
            and k_pool.dtype == v_pool.dtype
        )
        types_ok = (
            pages.dtype == torch.int32
            and pos.dtype == torch.int64
            and cos.dtype == torch.float32
            and sin.dtype == torch.float32
        )
        kshape = tuple(k_pool.shape) if k_pool.dim() == 5 else (0, 0, 0, 1, 0)
        pg, ps = pages.contiguous(), pos.contiguous()
        c, s = cos.contiguous(), sin.contiguous()
        T = x.shape[0] if x.dim() >= 1 else 0
        logits = torch.empty((max(1, min(logit_rows, T)), vocab), dtype=torch.float32)
        self._fail(
            self._lib.redline_decode_step(
                xc.data_ptr(),
                T,
                x.shape[1] if x_ok else -1,
                plan,
                vocab,
                c.data_ptr(),
                s.data_ptr(),
                c.shape[0],
                k_pool.data_ptr(),
                v_pool.data_ptr(),
                self._codes.get(k_pool.dtype, 7),
                int(pools_ok),
                *kshape,
                int(types_ok),
                pg.data_ptr(),
                pg.shape[0] if pg.dim() == 2 else -1,
                pg.shape[1] if pg.dim() == 2 else 0,
                ps.data_ptr(),
                ps.numel(),
                scale,
                logit_rows,
                logits.data_ptr(),
                torch.get_num_threads(),
            )
        )
        return logits

    def step_profile(self, enable: bool):
        torch = self._torch
        out = torch.zeros(12, dtype=torch.float64)
        self._lib.redline_step_profile(int(bool(enable)), ctypes.cast(out.data_ptr(), ctypes.POINTER(ctypes.c_double)))
        return out
