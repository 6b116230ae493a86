"""Redline's own decode step for the Llama family, in the spirit of gpt-fast.

transformers' ``generate()`` spends most of a CPU decode step in Python
(cache objects, masks, logits processors, hooks). This module runs the same
weights — taken from the already-loaded transformers model, not copied —
through a plain loop: a KV cache preallocated for the whole context, rotary
tables computed once, the q/k/v and gate/up projections fused into one matmul
each (the original modules keep *views* of the fused weight, so memory does not
grow), and nothing allocated per step but activations.

Supported: decoder blocks shaped like Llama's (Llama, Mistral, Qwen2, Qwen3,
SmolLM, …): RMSNorm → attention with rotary positions (grouped-query allowed;
optional q/k biases; optional per-head q/k norms) → RMSNorm → gated SiLU MLP.
Anything else (Gemma's shifted norms, sliding-window attention beyond the
window, bitsandbytes-quantised layers, …) is refused by ``supports()`` with the
reason, and the caller falls back to transformers' ``generate()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from redline.inference.memory.policy import weights_in_own_mappings

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "smollm3")


def supports(model) -> Optional[str]:
    """None if the fast path can run ``model``; otherwise the reason it cannot."""
    cfg = model.config
    mtype = getattr(cfg, "model_type", "?")
    if mtype not in SUPPORTED_TYPES:
        return f"the fast path supports {', '.join(SUPPORTED_TYPES)}, not {mtype}"
    if getattr(model, "hf_quantizer", None) is not None:
        return "bitsandbytes-quantised weights run through transformers (use the fast path's w8/w4 precisions)"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act} is not SiLU"
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
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        return "sliding-window attention"
    return None


def _is_plain_linear(module) -> bool:
    from redline.inference.loading.weight_only import PackedLinear

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


def _fuse_linears(modules) -> Callable[[torch.Tensor], torch.Tensor]:
    """One matmul for several projections that read the same input.

    Plain nn.Linear: concatenate the weights once and give the original modules
    views into the fused tensor, so the model's own forward (used by the other
    strategies) keeps working and no second copy stays in memory.
    Packed weight-only layers: fused the same way through their own ``fuse``.
    """
    from redline.inference.loading.weight_only import PackedLinear

    if all(isinstance(m, PackedLinear) for m in modules):
        return PackedLinear.fuse(modules)
    weight = torch.cat([m.weight.data for m in modules], dim=0)
    offset = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight.data = weight[offset : offset + rows]
        offset += rows
    biases = [m.bias for m in modules]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat(
            [
                b.data if b is not None else torch.zeros(m.weight.shape[0], dtype=weight.dtype, device=weight.device)
                for b, m in zip(biases, modules)
            ]
        )
    return lambda x: F.linear(x, weight, bias)


def _linear(module) -> Callable[[torch.Tensor], torch.Tensor]:
    from redline.inference.loading.weight_only import PackedLinear

    if isinstance(module, PackedLinear):
        return module.forward
    return lambda x, w=module.weight, b=module.bias: F.linear(x, w, b)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same arithmetic as LlamaRMSNorm (variance in fp32) so greedy outputs match transformers.
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FastDecoder:
    """Holds the fused weights, rotary tables and the static KV cache for one model."""

    def __init__(self, model, max_context: int = 0):
        reason = supports(model)
        if reason:
            raise ValueError(reason)
        cfg = model.config
        inner = model.model
        self.model = model
        self.dtype = inner.embed_tokens.weight.dtype
        self.device = inner.embed_tokens.weight.device
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.q_size = self.n_heads * self.head_dim
        self.kv_size = self.n_kv * self.head_dim
        self.embed = inner.embed_tokens.weight
        self.norm_w, self.norm_eps = inner.norm.weight, inner.norm.variance_epsilon
        self.lm_head = _linear(model.lm_head)
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qn = (attn.q_norm.weight, attn.q_norm.variance_epsilon) if hasattr(attn, "q_norm") else None
            kn = (attn.k_norm.weight, attn.k_norm.variance_epsilon) if hasattr(attn, "k_norm") else None
            self.layers.append(
                _Layer(
                    ln1=layer.input_layernorm.weight,
                    ln2=layer.post_attention_layernorm.weight,
                    eps1=layer.input_layernorm.variance_epsilon,
                    eps2=layer.post_attention_layernorm.variance_epsilon,
                    qkv=_fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj]),
                    o=_linear(attn.o_proj),
                    gate_up=_fuse_linears([mlp.gate_proj, mlp.up_proj]),
                    down=_linear(mlp.down_proj),
                    q_norm=qn,
                    k_norm=kn,
                )
            )
        self.scaling = self.head_dim**-0.5
        self.rotary = inner.rotary_emb
        self.max_context = 0
        self.cache_bytes = 0
        self.ensure_context(max_context or 256)

    def ensure_context(self, needed: int) -> None:
        """Allocate the static KV cache and rotary tables for ``needed`` positions (grown in powers of
        two, so a chat allocates a few times, not every turn; never beyond the model's limit)."""
        if needed <= self.max_context:
            return
        limit = int(getattr(self.model.config, "max_position_embeddings", needed) or needed)
        size = min(max(limit, needed), 1 << max(8, (needed - 1).bit_length()))
        self.k_cache = self.v_cache = None  # free the old cache before allocating the new one
        with torch.inference_mode():
            # Rotary tables from the model's own rotary module, so every rope type is covered.
            pos = torch.arange(size, device=self.device)[None]
            probe = torch.zeros(1, dtype=self.dtype, device=self.device)
            cos, sin = self.rotary(probe, pos)
        self.cos, self.sin = cos[0], sin[0]  # [T, head_dim]
        # [layer, kv_head, position, head_dim]: attention reads a prefix of it without copying.
        shape = (len(self.layers), self.n_kv, size, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.cache_bytes = 2 * self.k_cache.numel() * self.k_cache.element_size()
        self.max_context = size

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Run ``tokens`` (1-D) at positions start.. and return the last position's logits (fp32)."""
        T = tokens.shape[0]
        end = start + T
        x = F.embedding(tokens, self.embed)  # [T, H]
        cos, sin = self.cos[start:end], self.sin[start:end]
        causal = T > 1
        for i, L in enumerate(self.layers):
            h = _rms_norm(x, L.ln1, L.eps1)
            qkv = L.qkv(h)
            q = qkv[:, : self.q_size].view(T, self.n_heads, self.head_dim)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(T, self.n_kv, self.head_dim)
            v = qkv[:, self.q_size + self.kv_size :].view(T, self.n_kv, self.head_dim)
            if L.q_norm is not None:
                q = _rms_norm(q, *L.q_norm)
                k = _rms_norm(k, *L.k_norm)
            c, s = cos[:, None, :], sin[:, None, :]
            q = q * c + _rotate_half(q) * s
            k = k * c + _rotate_half(k) * s
            self.k_cache[i, :, start:end] = k.transpose(0, 1)
            self.v_cache[i, :, start:end] = v.transpose(0, 1)
            keys = self.k_cache[i, :, :end]
            values = self.v_cache[i, :, :end]
            if causal and start > 0:
                mask = torch.ones(T, end, dtype=torch.bool, device=self.device).tril(diagonal=start)
                attn = F.scaled_dot_product_attention(
                    q.transpose(0, 1),
                    keys,
                    values,
                    attn_mask=mask,
                    scale=self.scaling,
                    enable_gqa=self.n_kv != self.n_heads,
                )
            else:
                attn = F.scaled_dot_product_attention(
                    q.transpose(0, 1),
                    keys,
                    values,
                    is_causal=causal,
                    scale=self.scaling,
                    enable_gqa=self.n_kv != self.n_heads,
                )
            x = x + L.o(attn.transpose(0, 1).reshape(T, self.q_size))
            h = _rms_norm(x, L.ln2, L.eps2)
            gu = L.gate_up(h)
            inter = gu.shape[-1] // 2
            x = x + L.down(F.silu(gu[:, :inter]) * gu[:, inter:])
        x = _rms_norm(x[-1:], self.norm_w, self.norm_eps)
        return self.lm_head(x)[0].float()


def get_decoder(loaded, needed_context: int) -> FastDecoder:
    """One FastDecoder per loaded model (weights fused once); its cache grows when needed."""
    dec = getattr(loaded, "fast_decoder", None)
    if dec is not None and needed_context <= dec.max_context:
        return dec
    # The fused weights and the cache are model memory: mappings of their own, returned whole on unload.
    with weights_in_own_mappings():
        if dec is None:
            dec = FastDecoder(loaded.model, needed_context)
            loaded.fast_decoder = dec
        dec.ensure_context(needed_context)
    return dec
