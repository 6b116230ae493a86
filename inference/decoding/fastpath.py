"""Redline's own decode step for the Llama family, in the spirit of gpt-fast.

transformers' ``generate()`` spends most of a CPU decode step in Python
(cache objects, masks, logits processors, hooks). This module runs the same
weights — taken from the already-loaded transformers model, not copied —
through a plain loop: a paged KV cache (``kv_cache.py``), rotary tables computed
once, the q/k/v and gate/up projections fused into one product each (the
original modules keep *views* of the fused weight, so memory does not grow), and
per layer a handful of operator calls (``inference/kernels``): RMSNorm, the
fused products, one attention operator that applies the rotary embedding,
writes the cache and attends, SiLU·up. On a CPU with Redline's native kernels
the activations are fp32 and bf16 or block-quantised weights are read as they
are; elsewhere the same step runs on torch's operators in the model's dtype.

Supported: decoder blocks shaped like Llama's (Llama, Mistral, Qwen2, Qwen3,
SmolLM, …): RMSNorm → attention with rotary positions (grouped-query allowed;
optional q/k biases; optional per-head q/k norms) → RMSNorm → gated SiLU MLP.
Anything else (Gemma's shifted norms, sliding-window attention beyond the
window, bitsandbytes-quantised layers, …) is refused by ``supports()`` with the
reason, and the caller falls back to transformers' ``generate()``.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..cost import fast_path_refusal
from ..estimate.estimator import context_limit
from ..kernels import ops, paged_torch, reference
from ..kernels.cpu.library import native
from ..loading.weight_only import PackedLinear
from ..memory.policy import one_reading_of_the_mappings, release_pages, weights_in_own_mappings
from .compiled import CompiledStep
from .kv_cache import PagedKV


def supports(model) -> Optional[str]:
    """None if the fast path can run ``model``; otherwise the reason it cannot."""
    cfg = model.config
    reason = fast_path_refusal(
        getattr(cfg, "model_type", "?"),
        getattr(model, "hf_quantizer", None) is not None,
        bool(getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None)),
        getattr(cfg, "hidden_act", "silu"),
    )
    if reason:
        return reason
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "unexpected module layout"
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if not _is_plain_linear(getattr(attn, name, None)):
                return f"attention projection {name} is not a plain linear layer"
        for name in ("gate_proj", "up_proj", "down_proj"):
            if not _is_plain_linear(getattr(mlp, name, None)):
                return f"MLP projection {name} is not a plain linear layer"
    return None


def _is_plain_linear(module) -> bool:

    return isinstance(module, PackedLinear) or type(module) is torch.nn.Linear


@dataclass
class _Layer:
    ln1: torch.Tensor
    ln2: torch.Tensor
    eps1: float
    eps2: float
    qkv: Callable[[torch.Tensor], torch.Tensor]
    o: Callable[[torch.Tensor], torch.Tensor]
    gate_up: Callable[[torch.Tensor], torch.Tensor]
    down: Callable[[torch.Tensor], torch.Tensor]
    q_norm: Optional[tuple[torch.Tensor, float]]
    k_norm: Optional[tuple[torch.Tensor, float]]
    # The four products' weights as redline::decode_step reads them (weight, scales, mins, bias), None for a
    # product it cannot read (then the step runs operator by operator).
    specs: tuple[Optional[tuple], ...] = ()


def _with_bias(product, bias):
    if bias is None:
        return product
    return lambda x: product(x) + bias.to(x.dtype)


_NONE = torch.empty(0)


def _spec(weight, scales=None, mins=None, bias=None) -> Optional[tuple]:
    """A product as the whole-step operator reads it: fp32/bf16 rows or GGUF blocks, fp32 bias; else None."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16, torch.int8, torch.uint8):
        return None
    if weight.dim() != 2 or weight.stride(1) != 1:
        return None
    bias = _NONE if bias is None else bias.detach().float().contiguous()
    return (weight, _NONE if scales is None else scales, _NONE if mins is None else mins, bias)


def _blocks_spec(blocks, bias) -> Optional[tuple]:
    return _spec(blocks.qweight, blocks.scales, blocks.mins, bias)


def _fuse_linears(modules) -> tuple[Callable[[torch.Tensor], torch.Tensor], Optional[tuple]]:
    """One product for several projections that read the same input.

    Plain nn.Linear: concatenate the weights once and give the original modules
    views into the fused tensor, so the model's own forward (used by the other
    strategies) keeps working and no second copy stays in memory.
    Packed weight-only layers: fused the same way through their own ``fuse``.
    Returns the product and its weights for the whole-step operator (None where it cannot read them).
    """

    if all(isinstance(m, PackedLinear) for m in modules):
        joined = PackedLinear.fused_blocks(modules)
        if joined is None:
            return PackedLinear.fuse(modules), None
        blocks, bias = joined
        return _with_bias(ops.bind_blocks(blocks), bias), _blocks_spec(blocks, bias)
    originals = [m.weight.data for m in modules]
    weight = torch.cat(originals, dim=0)
    offset = 0
    for m in modules:
        rows = m.weight.shape[0]
        # A new parameter over the view, not ``.data =``: the same storage, and it also works on fake CUDA tensors
        # in a CPU-only torch (whose ``set_data`` asks the CUDA runtime).
        m.weight = torch.nn.Parameter(weight.narrow(0, offset, rows), requires_grad=False)
        offset += rows
    # Views of a mapped checkpoint leave the pages the copy read resident: give them back (memory/policy.py, 3.).
    release_pages(originals)
    del originals
    biases = [m.bias for m in modules]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat(
            [
                b.data if b is not None else torch.zeros(m.weight.shape[0], dtype=weight.dtype, device=weight.device)
                for b, m in zip(biases, modules)
            ]
        )
    return _with_bias(ops.bind_linear(weight), bias), _spec(weight, bias=bias)


def _linear(module) -> tuple[Callable[[torch.Tensor], torch.Tensor], Optional[tuple]]:

    if isinstance(module, PackedLinear):
        if module.blocks is not None:  # the fast step's activations are fp32 already: call the kernel directly
            return _with_bias(ops.bind_blocks(module.blocks), module.bias), _blocks_spec(module.blocks, module.bias)
        return module.forward, None
    return _with_bias(ops.bind_linear(module.weight), module.bias), _spec(module.weight.data, bias=module.bias)


def _native_cpu(device: torch.device) -> bool:

    return device.type == "cpu" and native() is not None


class FastDecoder:
    """Holds the fused weights, rotary tables and the paged KV cache for one model.

    ``prefill(tokens, start)`` runs several positions of one sequence (a prompt); ``step(tokens, positions,
    seqs)`` runs one new token for each of several sequences at once. Both return fp32 logits."""

    def __init__(self, model, max_context: int = 0, kv: str = "bf16"):
        reason = supports(model)
        if reason:
            raise ValueError(reason)
        cfg = model.config
        inner = model.model
        self.model = model
        self.dtype = inner.embed_tokens.weight.dtype
        self.device = inner.embed_tokens.weight.device
        self.native = _native_cpu(self.device)
        # On the CPU with the native kernels the activations are fp32: the kernels read bf16 and block
        # weights as they are, and fp32 element-wise work is what CPUs without bf16 arithmetic do fastest.
        self.act_dtype = torch.float32 if self.native else self.dtype
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.q_size = self.n_heads * self.head_dim
        self.kv_size = self.n_kv * self.head_dim
        self.embed = inner.embed_tokens.weight
        self.norm_w, self.norm_eps = self._norm_weight(inner.norm.weight), inner.norm.variance_epsilon
        self.lm_head, head_spec = _linear(model.lm_head)
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qn = (
                (self._norm_weight(attn.q_norm.weight), attn.q_norm.variance_epsilon)
                if hasattr(attn, "q_norm")
                else None
            )
            kn = (
                (self._norm_weight(attn.k_norm.weight), attn.k_norm.variance_epsilon)
                if hasattr(attn, "k_norm")
                else None
            )
            (qkv, qkv_spec), (o, o_spec) = _fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj]), _linear(attn.o_proj)
            (gate_up, gu_spec), (down, down_spec) = _fuse_linears([mlp.gate_proj, mlp.up_proj]), _linear(mlp.down_proj)
            self.layers.append(
                _Layer(
                    ln1=self._norm_weight(layer.input_layernorm.weight),
                    ln2=self._norm_weight(layer.post_attention_layernorm.weight),
                    eps1=layer.input_layernorm.variance_epsilon,
                    eps2=layer.post_attention_layernorm.variance_epsilon,
                    qkv=qkv,
                    o=o,
                    gate_up=gate_up,
                    down=down,
                    q_norm=qn,
                    k_norm=kn,
                    specs=(qkv_spec, o_spec, gu_spec, down_spec),
                )
            )
        self.scaling = self.head_dim**-0.5
        self.rotary = inner.rotary_emb
        # The cache in the model's dtype (as transformers keeps it), fp32 for an fp32 model; with ``kv`` "q8" in
        # 8-bit rows (int8 and a scale per token and head: kernels/kv_quant.py), on every device.
        cache_dtype = torch.float32 if self.dtype == torch.float32 else torch.bfloat16 if self.native else self.dtype
        self.kv = PagedKV(
            len(self.layers),
            self.n_kv,
            self.head_dim,
            cache_dtype,
            self.device,
            max_context or 256,
            cleared=not self.native,
            form=kv,
        )
        self.max_context = 0
        self.ensure_context(max_context or 256)
        self.compiled = None  # a CompiledStep once compiling is asked for (decoding/compiled.py)
        self.whole_step_plan, self.whole_step_reason = self._whole_step_plan(head_spec)
        # Whether decode steps (and short prefills) run as one redline::decode_step call; a switch, so the
        # operator-by-operator step can be measured against it in one process (tools/experiments/whole_step_ab.py).
        self.whole_step = self.whole_step_plan is not None
        # Short prompts through the whole step too? Off: it is faster for q8/q4 (44-token prompt, 5 interleaved
        # rounds: q8 130 vs 169 ms, q4 118 vs 151 ms; bf16 143 vs 132 ms), and in fp32 it matches the operators
        # (5e-5 on the starter's logits), but with int8 activations its other rounding of the prompt's attention
        # moved the starter's q8 answer to "What is the capital of France?" from "Paris" (what transformers and
        # the operators give) to nonsense. A switch until its prompt matches the operators more closely.
        self.whole_prefill = False
        # A few rows after cached positions through the native attention operator (``_prefill_native``); a switch
        # for tools/experiments/prefill_attention_ab.py.
        self.native_prefill = True

    def _whole_step_plan(self, head_spec) -> tuple[Optional[tuple], Optional[str]]:
        """The weight lists redline::decode_step reads (decode_step.cpp), or None and why it cannot run."""
        if not self.native:
            return None, "the native kernels do not run here"
        if os.environ.get("REDLINE_WHOLE_STEP", "1").strip().lower() in ("0", "false", "no", "off"):
            return None, "turned off (REDLINE_WHOLE_STEP=0)"
        hidden = self.embed.shape[1]
        if hidden % 8 or self.head_dim % 8:
            return None, f"hidden size {hidden} / head size {self.head_dim} not a multiple of 8"
        if head_spec is None or any(spec is None for L in self.layers for spec in L.specs):
            return None, "a product's weights are in a layout the whole-step kernel does not read"
        tensors, eps = [], []
        for L in self.layers:
            qn, qe = L.q_norm if L.q_norm is not None else (_NONE, 0.0)
            kn, ke = L.k_norm if L.k_norm is not None else (_NONE, 0.0)
            tensors += [L.ln1, L.ln2, qn, kn]
            for spec in L.specs:
                tensors += list(spec)
            eps += [float(L.eps1), float(L.eps2), float(qe), float(ke)]
        head = [self.norm_w, *head_spec]
        eps.append(float(self.norm_eps))
        try:  # checked once, in C++: a layout it refuses leaves the operator-by-operator step
            self.whole_step_id = torch.ops.redline.step_plan(tensors, head, eps, self.n_heads, self.n_kv, self.head_dim)
        except RuntimeError as exc:
            return None, f"the whole-step kernel refused the weights ({str(exc).splitlines()[0][:200]})"
        self.vocab = int(head_spec[0].shape[0])
        # The plan holds the weights; it goes when this decoder does.
        weakref.finalize(self, torch.ops.redline.drop_plan, self.whole_step_id)
        return (tensors, head, eps), None

    def _norm_weight(self, w: torch.Tensor) -> torch.Tensor:
        return w.detach().to(self.act_dtype) if w.dtype != self.act_dtype else w.detach()

    @property
    def cache_bytes(self) -> int:
        return self.kv.nbytes

    def ensure_context(self, needed: int) -> None:
        """Rotary tables for ``needed`` positions (grown in powers of two, so a chat computes them a few times,
        not every turn; never beyond the model's limit unless asked)."""
        if needed <= self.max_context:
            return
        limit = context_limit(self.model.config)  # its rope scaling included, as LoadedModel.context_limit
        size = min(max(limit, needed), 1 << max(8, (needed - 1).bit_length()))
        with torch.inference_mode():
            # Rotary tables from the model's own rotary module, so every rope type is covered.
            pos = torch.arange(size, device=self.device)[None]
            probe = torch.zeros(1, dtype=torch.float32, device=self.device)
            cos, sin = self.rotary(probe, pos)
        self.cos, self.sin = cos[0].float().contiguous(), sin[0].float().contiguous()  # [T, head_dim]
        self.max_context = size

    # -- the step ------------------------------------------------------------------------------------
    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        # index_select, not F.embedding: the same rows, and it also runs on fake CUDA tensors in a CPU-only torch
        # (where F.embedding ends the process: docs/performance.md, "On a GPU").
        return self.embed.index_select(0, tokens).to(self.act_dtype)

    def _qk_norms(self, qkv: torch.Tensor, L: _Layer) -> torch.Tensor:
        if L.q_norm is None:
            return qkv
        rows = qkv.shape[0]
        q = qkv[:, : self.q_size].reshape(rows, self.n_heads, self.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(rows, self.n_kv, self.head_dim)
        q = ops.rms_norm(q, *L.q_norm)
        k = ops.rms_norm(k, *L.k_norm)
        return torch.cat([q.reshape(rows, -1), k.reshape(rows, -1), qkv[:, self.q_size + self.kv_size :]], dim=-1)

    def _prefill_attention(self, q, keys, values, mask, T: int) -> torch.Tensor:
        """q [T, H, D], keys/values [Hkv, S, D] → [H, T, D]."""
        q, grouped = q.transpose(0, 1), {"enable_gqa": self.n_kv != self.n_heads}
        if self.device.type == "cpu":
            # torch's fused (flash) kernel for CPUs wants 4-D inputs, as many KV heads as query heads and an additive
            # mask; grouped-query keys or a boolean mask send it to the unfused math path. Measured (starter shapes,
            # 256 rows over 1,536 positions, 2-core Zen 3): 10.9 ms this way vs 29.6 ms.
            rep = self.n_heads // self.n_kv
            if rep > 1:
                keys, values = keys.repeat_interleave(rep, 0), values.repeat_interleave(rep, 0)
            q, keys, values, grouped = q[None], keys[None], values[None], {}
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, is_causal=mask is None and T > 1, scale=self.scaling, **grouped
        )
        return out[0] if out.dim() == 4 else out

    def _mlp(self, x: torch.Tensor, L: _Layer) -> torch.Tensor:
        h = ops.rms_norm(x, L.ln2, L.eps2)
        return x + L.down(ops.silu_mul(L.gate_up(h)))

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(ops.rms_norm(x, self.norm_w, self.norm_eps)).float()

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, start: int = 0, seq: int = 0) -> torch.Tensor:
        """Run ``tokens`` (1-D) of sequence ``seq`` at positions start..; the last position's logits (fp32)."""
        T = tokens.shape[0]
        end = start + T
        self.ensure_context(end)
        self.kv.reserve(seq, end)
        x = self._embed(tokens)  # [T, H]
        if self.whole_step and self.whole_prefill and T < ops.GEMM_ROWS:
            # A short prompt is a step of T rows of one sequence: each row attends to the positions up to its
            # own, which the step writes before any row attends. Longer prompts run through torch's matrix
            # products and attention (faster from ops.GEMM_ROWS rows on).
            pages = self.kv.table([seq]).expand(T, -1)
            pos = torch.arange(start, end, dtype=torch.long, device=self.device)
            return self._whole_step(x, pages, pos, self.kv.k, self.kv.v, self.cos, self.sin, 1)[0]
        if self.native and self.native_prefill and start > 0 and T < ops.GEMM_ROWS:
            return self._prefill_native(x, start, seq)
        cos = self.cos[start:end, None, :].to(self.act_dtype)
        sin = self.sin[start:end, None, :].to(self.act_dtype)
        mask = None  # a chunk after the first sees every earlier position and its own causally
        if T > 1 and start > 0:
            mask = torch.ones(T, end, dtype=torch.bool, device=self.device).tril(diagonal=start)
            if self.device.type == "cpu":
                mask = torch.zeros(T, end, dtype=self.act_dtype, device=self.device).masked_fill(~mask, float("-inf"))
        for i, L in enumerate(self.layers):
            h = ops.rms_norm(x, L.ln1, L.eps1)
            qkv = self._qk_norms(L.qkv(h), L)
            q, k, v = reference.split_qkv(qkv, self.n_heads, self.n_kv, self.head_dim)
            q, k = reference.rotate(q, cos, sin), reference.rotate(k, cos, sin)
            self.kv.write(i, seq, start, k, v)  # in the cache's form (quantised for 8-bit rows)
            keys, values = self.kv.read(i, seq, end, self.act_dtype)
            attn = self._prefill_attention(q, keys, values, mask, T)
            x = x + L.o(attn.transpose(0, 1).reshape(T, self.q_size))
            x = self._mlp(x, L)
        return self._logits(x[-1:])[0]

    def _prefill_native(self, x: torch.Tensor, start: int, seq: int) -> torch.Tensor:
        """A few rows after cached positions (a conversation's next turn, a tool's result) through the native
        attention operator (the decode step's, ``ops.attend``): each row attends over the sequence's pages in
        place, its keys written by the same call. torch's attention reads every earlier position out of the
        pages into one tensor per layer (``kv.read``), repeats the keys for each query head and builds a mask:
        work that grows with the context, not the new rows. Measured on the starter (q8 weights, 5 alternated
        rounds, tools/experiments/prefill_attention_ab.py, load 2.2): 14 rows after 1,728 cached 100.9 → 48.5 ms,
        after 64 46.9 → 34.6 ms. Elsewhere the gain is small (a fresh 33-token prompt 1.19×, 256 rows after 3,840
        1.07×)
        and the old path stays: the two are the same fp32 sums in another order (10⁻⁶ apart per layer), but with
        8- or 4-bit weights the activations' int8 rounding turns that into a few tenths of a logit, and the
        starter's q8 first token for "What is the capital of France?" is a near tie ('The' 25.48, 'L' 25.46)
        that the other order flips into a French ramble."""
        T = x.shape[0]
        pages = self.kv.table([seq]).expand(T, -1).contiguous()
        pos = torch.arange(start, start + T, dtype=torch.long, device=self.device)
        x = self._paged_layers(x, pages, pos, self.kv.k, self.kv.v, self.cos, self.sin)
        return self._logits(x[-1:])[0]

    def can_mix(self, rows: int) -> bool:
        """Whether a prompt chunk and decode rows can run as one step of ``rows`` rows (``mixed_step``)."""
        return self.whole_step and rows < ops.GEMM_ROWS

    @torch.inference_mode()
    def mixed_step(
        self,
        chunk: torch.Tensor,
        start: int,
        seq: int,
        tokens: torch.Tensor,
        positions: list[int],
        seqs: list[int],
        chunk_logits: bool = True,
    ) -> tuple[Optional[torch.Tensor], torch.Tensor]:
        """A chunk of one sequence's prompt (``chunk`` [T] at positions start..) and one new token for each of
        ``seqs`` in one pass over the weights: a reply streaming beside a long prompt then waits for the chunk's
        arithmetic only, not for a second read of every weight (on a CPU the decode step is bound by that read).
        The logits of the chunk's last row [vocab] (None without ``chunk_logits``: a chunk that does not end the
        prompt needs none, and the head is a fifth of the starter's step) and of each decoding sequence [B, vocab].
        Needs ``can_mix``."""
        T, B = chunk.shape[0], tokens.shape[0]
        end = start + T
        self.kv.reserve(seq, end)
        for s, p in zip(seqs, positions):
            self.kv.reserve(s, p + 1)
        self.ensure_context(max(end, max(positions) + 1))
        table = self.kv.table([seq, *seqs])
        pages = torch.cat([table[:1].expand(T, -1), table[1:]]).contiguous()
        pos = torch.cat(
            [
                torch.arange(start, end, dtype=torch.long, device=self.device),
                torch.tensor(positions, dtype=torch.long, device=self.device),
            ]
        )
        x = self._embed(torch.cat([chunk, tokens]))
        logits = self._whole_step(x, pages, pos, self.kv.k, self.kv.v, self.cos, self.sin, B + int(chunk_logits))
        return (logits[0] if chunk_logits else None), logits[int(chunk_logits) :]

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, positions: list[int], seqs: list[int]) -> torch.Tensor:
        """One new token for each sequence in ``seqs`` (``tokens`` [B], at ``positions``); logits [B, vocab]."""
        for seq, p in zip(seqs, positions):
            self.kv.reserve(seq, p + 1)
        self.ensure_context(max(positions) + 1)
        compiled = self.compiled
        if compiled is not None and compiled.ready():
            out = compiled.run(tokens, positions, seqs)
            if out is not None:
                return out
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        pages = self.kv.table(seqs)
        step = None
        if not self.native:  # torch's attention reads each sequence's pages in use (lengths known here)
            step = paged_torch.StepPages.build(pages, pos, [self.kv.tables[s] for s in seqs], positions, self.kv.page)
        return self.decode_graph(tokens, pos, pages, self.kv.k, self.kv.v, self.cos, self.sin, step)

    def decode_graph(self, tokens, pos, pages, k_pool, v_pool, cos, sin, step=None) -> torch.Tensor:
        """The decode step as a function of tensors: ``pages`` is the page table [B, W], ``pos`` [B] each row's
        position. Where the native kernels do not run, attention reads the pages in use eagerly with ``step``
        (its host-side lengths) and, without it, with static shapes (``paged_torch.attend_static``: what a
        compiled step and a CUDA graph hold)."""
        x = self._embed(tokens)  # [B, H]
        if self.whole_step:
            return self._whole_step(x, pages, pos, k_pool, v_pool, cos, sin, x.shape[0])
        return self._logits(self._paged_layers(x, pages, pos, k_pool, v_pool, cos, sin, step))

    def _paged_layers(self, x, pages, pos, k_pool, v_pool, cos, sin, step=None) -> torch.Tensor:
        """The layers, operator by operator, for rows ``x`` at ``pos`` over the paged cache (each row's keys
        written, then attended over its sequence's pages): a decode step's rows, or a prompt's after cached
        positions (``_prefill_native``)."""
        for i, L in enumerate(self.layers):
            h = ops.rms_norm(x, L.ln1, L.eps1)
            qkv = self._qk_norms(L.qkv(h), L)
            if self.native:
                attn = ops.attend(
                    qkv, cos, sin, k_pool[i], v_pool[i], pages, pos, self.n_heads, self.n_kv, self.scaling
                )
            else:
                attn = self._attend_pages(qkv, k_pool[i], v_pool[i], pages, pos, cos, sin, step)
            x = x + L.o(attn.to(x.dtype))
            x = self._mlp(x, L)
        return x

    def _attend_pages(self, qkv, k_pool, v_pool, pages, pos, cos, sin, step) -> torch.Tensor:
        """torch's paged attention (kernels/paged_torch.py) over the same pages as the native kernel's."""
        q, k, v = reference.split_qkv(qkv, self.n_heads, self.n_kv, self.head_dim)
        q, k = paged_torch.rotary_rows(q, k, cos, sin, pos)
        paged_torch.write(k_pool, v_pool, pages, pos, k, v)
        if step is not None:
            out = paged_torch.attend(q, k_pool, v_pool, step, self.scaling)
        else:
            out = paged_torch.attend_static(q, k_pool, v_pool, pages, pos, self.scaling)
        return out.reshape(q.shape[0], self.q_size)

    def _whole_step(self, x, pages, pos, k_pool, v_pool, cos, sin, logit_rows: int) -> torch.Tensor:
        return ops.native().decode_step(  # straight through ctypes; torch.ops.redline.decode_step when compiling
            x, self.whole_step_id, self.vocab, cos, sin, k_pool, v_pool, pages, pos, self.scaling, logit_rows
        )

    def weights_signature(self) -> str:
        """The weights' dtypes and layouts (what a compiled step depends on, beside the shapes)."""

        mods = [self.model.lm_head] + [
            m
            for layer in self.model.model.layers
            for m in layer.modules()
            if isinstance(m, (PackedLinear, torch.nn.Linear))
        ]
        kinds = sorted(
            {
                f"{type(m).__name__}:{getattr(m, 'layout', '')}:{getattr(m, 'bits', '')}:"
                f"{getattr(getattr(m, 'weight', None), 'dtype', '')}"
                for m in mods
            }
        )
        return ";".join(kinds)

    def forward(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Positions start.. of the one chat sequence: a prefill, or one token (a decode step)."""
        if tokens.shape[0] == 1 and start > 0:
            return self.step(tokens, [start], [0])[0]
        return self.prefill(tokens, start)

    def compile_in_background(self, batch: int = 1):
        """Start compiling the decode step for ``batch`` sequences; eager until it is ready."""

        if self.compiled is None or self.compiled.batch != batch:
            self.compiled = CompiledStep(self, batch)
        self.compiled.start()
        return self.compiled

    def release(self) -> None:
        """Forget every sequence (a new reply starts from position 0)."""
        for seq in list(self.kv.tables):
            self.kv.release(seq)


def get_decoder(loaded, needed_context: int) -> FastDecoder:
    """One FastDecoder per loaded model (weights fused once); its cache grows when needed."""
    dec = getattr(loaded, "fast_decoder", None)
    if dec is None:
        kv = getattr(getattr(loaded, "limits", None), "kv", "bf16")  # the KV form chosen for this load (--kv)
        # The fused weights are model memory: mappings of their own, returned whole on unload. The pages the
        # fusions read are given back after each, from one reading of the file mappings.
        with weights_in_own_mappings(), one_reading_of_the_mappings():
            dec = FastDecoder(loaded.model, needed_context, kv=kv)
        loaded.fast_decoder = dec
    dec.ensure_context(needed_context)
    return dec
