"""Weight-only int8 and int4 linear layers: the ``q8`` and ``q4`` precisions.

At batch 1 a decode step reads every weight once, so bytes per weight decide speed. bitsandbytes saves
memory but its kernels are slow at batch 1 (its int8 path is usually slower than fp16). ``q8`` and ``q4``
replace the model's linear layers with ``PackedLinear``, so transformers' forward and the fast path both
use them. A layer keeps its weights in one of two layouts, chosen where it is built:

- **blocks** (on a CPU where Redline's native kernels run): GGUF's Q8_0 / Q4_1 layout, 32 weights per
  block with an fp16 scale (``block_quant.py``), multiplied by ``redline::linear_q8`` / ``linear_q4``;
  a GGUF file's own Q8_0 / Q4_0 / Q4_1 blocks load into it unchanged;
- **torch** (CUDA, or a CPU without the native kernels): torch's packed formats — per-output-channel
  int8 for ``_weight_int8pack_mm`` and group-wise int4 for ``_weight_int4pack_mm[_for_cpu]``.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn as nn

from ..kernels import block_quant, ops
from ..kernels.block_quant import BlockWeights
from ..kernels.cpu.library import native
from ..kernels.ops import quantize_blocks
from ..memory.policy import release_pages

INT4_GROUP = block_quant.BLOCK  # torch's int4 groups are the blocks' 32 weights: cost.py counts both alike
INT4_INNER_K_TILES = 2


def _use_blocks(device: torch.device) -> bool:
    if device.type != "cpu":
        return False

    return native() is not None


class PackedLinear(nn.Module):
    def __init__(
        self,
        linear: nn.Linear,
        bits: int,
        compute_dtype: torch.dtype,
        group_size: int = INT4_GROUP,
        device: torch.device | str | None = None,
        blocks: Optional[BlockWeights] = None,
    ):
        super().__init__()
        device = torch.device(device) if device is not None else linear.weight.device
        if bits not in (8, 4):
            raise ValueError("bits must be 8 or 4")
        self.bits = bits
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.compute_dtype = compute_dtype
        bias = linear.bias.data.to(device=device, dtype=compute_dtype) if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)
        self.blocks: Optional[BlockWeights] = None
        if blocks is None and self.in_features % block_quant.BLOCK == 0 and _use_blocks(device):
            blocks = quantize_blocks(linear.weight.data, bits)
        if blocks is not None and _use_blocks(device):
            self.blocks = blocks.to(device)
            self.layout = "blocks"
            self.weight_bytes = self.blocks.nbytes
            return
        if blocks is not None:  # no native kernels here: from the blocks' values into torch's layouts
            w = block_quant.dequantize(blocks)
        else:
            w = linear.weight.data.to(torch.float32)
        self.layout = "torch"
        self._pack_for_torch(w, bits, compute_dtype, group_size, device)
        self.weight_bytes = self.qweight.numel() * self.qweight.element_size() + (
            self.scales.numel() * self.scales.element_size()
        )

    def _pack_for_torch(self, w, bits, compute_dtype, group_size, device) -> None:
        w = w.to(torch.float32)
        if bits == 8:
            scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
            q = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8)
            self.register_buffer("qweight", q.to(device), persistent=False)
            self.register_buffer("scales", scale.to(device=device, dtype=compute_dtype), persistent=False)
            return
        if self.in_features % group_size:
            raise ValueError(f"in_features {self.in_features} is not a multiple of the int4 group {group_size}")
        self.group_size = group_size
        g = w.view(self.out_features, -1, group_size)
        lo, hi = g.amin(dim=-1), g.amax(dim=-1)
        scale = ((hi - lo) / 15).clamp(min=1e-8)
        q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
        q = q.view(self.out_features, self.in_features)
        zero = lo + scale * 8  # the kernels dequantise as (q - 8) * scale + zero
        sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
        # The packed layout is device-specific, so pack where the layer will run.
        if device.type == "cpu":
            packed = torch._convert_weight_to_int4pack_for_cpu(q, INT4_INNER_K_TILES)
        else:
            packed = torch._convert_weight_to_int4pack(
                (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8).to(device), INT4_INNER_K_TILES
            )
        self.register_buffer("qweight", packed, persistent=False)
        self.register_buffer("scales", sz.to(device), persistent=False)

    @classmethod
    def from_blocks(
        cls,
        blocks: BlockWeights,
        bias: torch.Tensor | None,
        compute_dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> "PackedLinear":
        """A layer from block-quantised weights (``block_quant.BlockWeights``: GGUF's Q8_0/Q4_0/Q4_1 layout),
        kept as they are where the native kernels run."""
        linear = nn.Linear(blocks.in_features, blocks.out_features, bias=bias is not None, device="meta")
        if bias is not None:
            linear.bias = nn.Parameter(bias.detach().to(torch.float32), requires_grad=False)
        return cls(linear, blocks.bits, compute_dtype, device=device or "cpu", blocks=blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocks is not None:
            y = ops.linear_blocks(x.to(torch.float32), self.blocks).to(x.dtype)
        else:
            shape = x.shape
            x2 = x.reshape(-1, self.in_features)
            if self.bits == 8:
                y = torch._weight_int8pack_mm(x2.to(self.scales.dtype), self.qweight, self.scales)
            elif x2.device.type == "cpu":
                y = torch._weight_int4pack_mm_for_cpu(x2.to(torch.bfloat16), self.qweight, self.group_size, self.scales)
            else:
                y = torch._weight_int4pack_mm(x2.to(torch.bfloat16), self.qweight, self.group_size, self.scales)
            y = y.to(x.dtype).reshape(*shape[:-1], self.out_features)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y

    @staticmethod
    def fused_blocks(modules: Sequence["PackedLinear"]) -> Optional[tuple[BlockWeights, Optional[torch.Tensor]]]:
        """The modules' blocks concatenated into one weight (the modules keep views: no second copy) and their
        biases as one fp32 vector (None without biases); None when they are not blocks of one kind."""
        if not (
            all(m.blocks is not None for m in modules)
            and len({m.blocks.bits for m in modules}) == 1
            and (len({m.blocks.mins is None for m in modules}) == 1)
        ):
            return None
        parts = [m.blocks for m in modules]
        mins = None if parts[0].mins is None else torch.cat([p.mins for p in parts])
        fused = BlockWeights(
            parts[0].bits, torch.cat([p.qweight for p in parts]), torch.cat([p.scales for p in parts]), mins
        )
        offset = 0
        for m in modules:
            n = m.out_features
            m.blocks = BlockWeights(
                fused.bits,
                fused.qweight[offset : offset + n],
                fused.scales[offset : offset + n],
                None if mins is None else fused.mins[offset : offset + n],
            )
            offset += n
        # A converted GGUF's blocks are views of its files: the pages this copy read go back (memory/policy.py).
        release_pages([t for p in parts for t in (p.qweight, p.scales, p.mins)])
        if not any(m.bias is not None for m in modules):
            return fused, None
        device = fused.qweight.device
        bias = torch.cat(
            [m.bias.float() if m.bias is not None else torch.zeros(m.out_features, device=device) for m in modules]
        )
        return fused, bias

    @staticmethod
    def fuse(modules: Sequence["PackedLinear"]) -> Callable[[torch.Tensor], torch.Tensor]:
        """One kernel call for projections sharing an input. Blocks and int8 rows concatenate (the modules
        keep views); torch's int4 layout is tiled, so those layers run one after another."""

        biases = [m.bias for m in modules]
        has_bias = any(b is not None for b in biases)

        def fused_bias(dtype, device):
            return torch.cat(
                [
                    b if b is not None else torch.zeros(m.out_features, dtype=dtype, device=device)
                    for b, m in zip(biases, modules)
                ]
            )

        joined = PackedLinear.fused_blocks(modules)
        if joined is not None:
            fused, bias = joined
            product = ops.bind_blocks(fused)
            if bias is None:
                return product
            return lambda x: product(x) + bias
        if all(m.blocks is None and m.bits == 8 for m in modules):
            q = torch.cat([m.qweight for m in modules])
            s = torch.cat([m.scales for m in modules])
            offset = 0
            for m in modules:
                n = m.out_features
                m.qweight, m.scales = q[offset : offset + n], s[offset : offset + n]
                offset += n
            bias = fused_bias(s.dtype, s.device) if has_bias else None

            def fused(x: torch.Tensor) -> torch.Tensor:
                shape = x.shape
                y = torch._weight_int8pack_mm(x.reshape(-1, shape[-1]).to(s.dtype), q, s).to(x.dtype)
                y = y.reshape(*shape[:-1], q.shape[0])
                return y + bias.to(x.dtype) if bias is not None else y

            return fused
        return lambda x: torch.cat([m(x) for m in modules], dim=-1)


def quantize_model(
    model,
    bits: int,
    compute_dtype: torch.dtype,
    include_lm_head: bool = True,
    device: torch.device | str | None = None,
    skip: Sequence[str] = (),
) -> int:
    """Replace the decoder's linear layers (and the output head) by PackedLinear. Returns their weight bytes.

    A tied output head gets its own quantised copy: the embedding table stays for lookups
    (which read one row per token) while the head, read whole every step, becomes small. ``skip``: modules left
    as they are, with everything under them (a vision model's tower).
    """
    total = 0
    targets = []
    for name, module in model.named_modules():
        if any(name == s or name.startswith(s + ".") for s in skip):
            continue
        for child_name, child in module.named_children():
            if type(child) is nn.Linear:
                full = f"{name}.{child_name}" if name else child_name
                if (full == "lm_head" and not include_lm_head) or full in skip:
                    continue
                if bits == 4 and child.in_features % INT4_GROUP:
                    continue  # stays in the compute dtype
                targets.append((module, child_name, child))
    for parent, child_name, child in targets:
        packed = PackedLinear(child, bits, compute_dtype, device=device)
        total += packed.weight_bytes
        setattr(parent, child_name, packed)
        del child
    if include_lm_head and getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False  # the head is now its own (quantised) tensor
    return total
