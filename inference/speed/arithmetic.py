"""Decode tokens/s and time to first token, predicted before loading from the model's shape and this machine.

A decode step at batch 1 reads every weight once, plus the KV cache so far, and does about two floating-point
operations per weight per token it processes. So a step over ``T`` tokens takes

    max(bytes read ÷ (bandwidth × memory efficiency),  FLOPs ÷ (FLOP/s × compute efficiency))
      + layers × per-layer overhead + per-step overhead

where the bandwidth and the FLOP/s are measured on this machine (``hardware/bandwidth.py``,
``hardware/compute.py``), the efficiencies are what a precision's kernels reach of them, and the overheads are
the time a step spends outside its kernels (Python, torch's dispatcher, kernel launches) — what decides a small
model's speed. The strategies differ in how many tokens a step processes and how many steps a token takes:

- ``kv`` / ``static`` / ``fast`` / ``prompt-lookup``: one token per step, the cache read at the average context;
- ``naive``: no cache, so every step re-runs the whole sequence (compute grows with the position);
- ``speculative``: ``k`` draft steps and one verification step of ``k + 1`` tokens yield
  ``(1 − α^(k+1)) ÷ (1 − α)`` tokens on average, α being the per-token acceptance (Leviathan et al., 2023).

Time to first token is the prefill (the prompt in one step) plus the call's set-up. A turn whose prompt starts with
pages the prefix cache holds (a conversation's next turn) reads only the rest: a prefill of ``prompt − cached`` tokens
with ``cached`` positions already in the cache (attention reads them). The KV cache is read in its form (``--kv``).

The efficiencies and overheads below are defaults, reasoned from the kernels and the measurements in
docs/performance.md; every machine differs, so the prediction is multiplied by a factor learned from this machine's
own measurements (``speed/calibration.py``).

Weights are counted with the sizes the loader really uses: fp32 4 bytes, bf16/fp16 2, ``q8`` GGUF Q8_0 blocks
(1 + 2/32 bytes per weight) and ``q4`` Q4_1 blocks (0.5 + 4/32) on a CPU, torch's packed layouts on CUDA,
bitsandbytes as the memory estimator counts it. This module imports neither torch nor transformers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from ..cost import (
    BLOCK,
    DTYPE_BYTES,
    code_path,
    compute_dtype,
    kernels_run,
    kv_read_bytes,
    packed_layer_bytes,
    step_flops,
    weights_read_bytes,
)
from ..estimate.calibration import device_key, loaded_shape
from ..estimate.estimator import ModelShape
from ..hardware.bandwidth import bandwidth
from ..hardware.compute import cached, flops
from ..precision import WEIGHT_ONLY, PrecisionSpec
from ..units import format_bytes

# The fast path on torch's operators (no kernels for this CPU, none shipped and no compiler, or turned off):
# torch's bf16 matrix-vector product is a scalar loop on AVX2 (about 9 of 23 GB/s here, as transformers' path),
# its packed int8 and int4 products at batch 1 reach less than the block kernels (the fast path ran at 0.2-0.6x
# llama.cpp before the kernels, q4 the lowest), and a layer is a dozen torch operators instead of one fused call.
# Reasoned defaults, like the rest of this table; the learned factors correct them where it runs.
FAST_TORCH_MEMORY = {"fp32": 0.8, "bf16": 0.35, "fp16": 0.15, "q8": 0.3, "q4": 0.15}
FAST_TORCH_LAYER_S = 4e-4
FAST_TORCH_STEP_S = 2e-3
# Fraction of the measured bandwidth a decode step's reads reach, by device, code path and precision.
# CPU: torch's fp32 matrix-vector product streams close to the bandwidth; its bf16 one does not (about 9 of
# 23 GB/s measured), while the fast path's native bf16/q8/q4 kernels do better; bitsandbytes is slow at batch 1.
MEMORY_EFFICIENCY = {
    ("cpu", "hf"): {"fp32": 0.8, "bf16": 0.35, "fp16": 0.15, "q8": 0.5, "q4": 0.4, "int8": 0.2, "nf4": 0.25},
    # Redline's kernels at batch 1: the share of the measured bandwidth a product's weights stream at once a
    # row's fixed cost is apart (ROW_S below), fitted to a step's stage profile (tools/experiments/step_profile.py,
    # 2026-12-04, Zen 4, 25.3 GB/s and 123 GFLOP/s measured in the same minutes): bf16 11.4 G weights/s, Q8_0
    # 20.7. 4-bit blocks are bound by their arithmetic (DECODE_ARITHMETIC) instead.
    ("cpu", "fast"): {"fp32": 0.9, "bf16": 0.9, "fp16": 0.15, "q8": 0.87, "q4": 0.9},
    # The fast path where Redline's CPU kernels cannot run: the same step on torch's operators (reference.py).
    ("cpu", "fast-torch"): FAST_TORCH_MEMORY,
    ("cuda", "hf"): {"fp32": 0.75, "bf16": 0.75, "fp16": 0.75, "q8": 0.5, "q4": 0.4, "int8": 0.15, "nf4": 0.3},
    ("cuda", "fast"): {"fp32": 0.8, "bf16": 0.8, "fp16": 0.8, "q8": 0.6, "q4": 0.5},
    ("cuda", "graph"): {"fp32": 0.8, "bf16": 0.8, "fp16": 0.8, "q8": 0.6, "q4": 0.5, "int8": 0.15, "nf4": 0.3},
}
# Fraction of the measured FLOP/s (fp32 on a CPU, bf16 on CUDA) a prefill's products reach, by precision.
COMPUTE_EFFICIENCY = {
    "cpu": {"fp32": 0.7, "bf16": 0.3, "fp16": 0.1, "q8": 0.3, "q4": 0.25, "int8": 0.1, "nf4": 0.1},
    "cuda": {"fp32": 0.15, "bf16": 0.6, "fp16": 0.6, "q8": 0.3, "q4": 0.3, "int8": 0.1, "nf4": 0.2},
}
# A decode step's block products at batch 1 (Redline's CPU kernels): weights per second, as a share of the
# machine's measured FLOP/s at two operations per weight. The 4-bit kernels are bound by their arithmetic (each
# nibble unpacked, scaled, offset): Q4_0 files (10 % fewer bytes) ran no faster than Q4_1 blocks, and the stage
# profile's 4-bit products on the starter and a 1B-shaped model came to 28.8 G weights/s against 123 GFLOP/s
# measured. Q8_0 blocks are bound by their bytes from memory (their in-cache rate is about twice their streamed
# one), so their arithmetic share only matters on a machine with far more bandwidth than compute.
DECODE_ARITHMETIC = {"q4": 0.47, "q8": 0.5}
# Each output row costs the kernels a fixed time beside its weights (its horizontal sum and scale, the start of
# its streams), so a model of narrow layers is slower per weight than one of wide layers: Q8_0 rows ran at 9-10
# G weights/s 576 wide (the starter) and 19-26 at 2,048-8,192 (a 1B-shaped model), in the stage profile and in
# products alone. Fitted with the rates above, per class (11 products in bf16 and in 8-bit, 13 in 4-bit; within
# 20 %, most within 10 %, where one rate per class without it put the starter's 8-bit head at half its time).
ROW_S = {"dense": 2.3e-8, "q8": 2.6e-8, "q4": 2.5e-9}
# A prompt's products on the kernels cost the same per output beside their arithmetic: every (token, output) is a
# horizontal sum, a scale and a store, and the norms, rotary and activations between products grow with the
# outputs too. In FLOPs of the products' own rate: the starter (576 wide) and a 1B-shaped model (2,048 wide) read
# their 300-token prompts at 0.93 and 5.7 ms a token in bf16 (tools/accuracy/ttft_accuracy.py, Zen 5, 512-bit tiles),
# which one FLOP rate cannot both give (the starter-calibrated 1B TTFT was 20-42 % slow); per token, FLOPs ÷ 415 GFLOP/s
# plus 2.65 ns an output fits both, 1,100 FLOPs an output.
PROMPT_OUTPUT_FLOPS = 1100.0
# And each product a start-up (handing it to the threads): a few µs, from the same fit.
PRODUCT_START_S = 2.5e-6
FAST_PRODUCTS_PER_LAYER = 4
# Seconds a step spends outside its kernels, per layer and per step: transformers' generate() runs Python
# per module; the fast path runs fused operators; a CUDA graph (``static`` compiled on CUDA) replays them.
LAYER_OVERHEAD_S = {
    ("cpu", "hf"): 4.5e-4,
    # The whole step (one native call; tools/experiments/step_profile.py): norms, rotary, the cache write and the
    # activations' quantising took 0.1-0.2 ms over 16-30 layers, the rest of a layer is its products (counted above).
    ("cpu", "fast"): 1e-5,
    ("cpu", "fast-torch"): FAST_TORCH_LAYER_S,
    ("cuda", "hf"): 2.5e-4,
    ("cuda", "fast"): 8e-5,
    ("cuda", "graph"): 1.5e-5,
}
STEP_OVERHEAD_S = {
    ("cpu", "hf"): 3e-3,
    ("cpu", "fast"): 8e-4,  # 0.6-0.9 ms a token outside the step (sampling, streaming, Python), same profile
    ("cpu", "fast-torch"): FAST_TORCH_STEP_S,
    ("cuda", "hf"): 2e-3,
    ("cuda", "fast"): 5e-4,
    ("cuda", "graph"): 1e-4,
}
CALL_OVERHEAD_S = {"hf": 0.02, "fast": 0.005, "graph": 0.005}  # set-up before the first forward pass
SPECULATIVE_STEP_OVERHEAD_S = {"cpu": 4e-3, "cuda": 2e-3}  # assisted decoding's own work per step
ASSUMED_ACCEPTANCE = 0.6  # per-token acceptance used for a pair until one is measured (said so in the result)


def _rate_key(spec: PrecisionSpec, shape: Optional[ModelShape] = None) -> str:
    if spec.name == "gguf":  # a GGUF's own Q4/Q8 blocks run on the same block kernels as q4/q8
        return gguf_kernels(shape)
    return "fp4" if spec.name == "fp4" else spec.name


def gguf_kernels(shape: Optional[ModelShape]) -> str:
    """Which block kernels run a GGUF's layers, as the file is: "q8" where most of its packed weights (by count)
    are 8-bit, else "q4". A Q8_0 file was predicted with the 4-bit kernels' rates and factors before, 28-36 %
    too slow after calibration (docs/models.md)."""
    weights = _file_block_weights(shape)
    return "q8" if weights[8] > weights[4] else "q4"


def _kernel_bits(bits) -> int:
    """The block kernels a GGUF layer of ``bits`` runs on: 6 bits and up load as 8-bit blocks, the rest as 4-bit."""
    return 8 if int(bits) >= 6 else 4


def _file_block_weights(shape: Optional[ModelShape]) -> dict[int, int]:
    """A GGUF's packed weights by the block kernels that run them."""
    counts = {8: 0, 4: 0}
    for _name, fan_in, fan_out, bits, *_ in getattr(shape, "packed", None) or []:
        counts[_kernel_bits(bits)] += int(fan_in) * int(fan_out)
    return counts


def product_classes(shape: ModelShape, spec: PrecisionSpec, device: str = "cpu") -> dict[str, tuple[int, int, int]]:
    """A decode step's products on Redline's kernels by weight class ("dense", "q8", "q4"): (weights, output rows,
    bytes) of each. A GGUF's packed layers by their file's types (6 bits and up run as 8-bit blocks), the rest of
    its linear layers dense; q8/q4 every linear layer (a 4-bit one whose fan-in is not a multiple of 32 stays
    dense)."""
    dtype = compute_dtype(spec, device)
    b = DTYPE_BYTES[dtype]
    out = {"dense": [0, 0, 0], "q8": [0, 0, 0], "q4": [0, 0, 0]}

    def add(cls: str, fan_in: int, fan_out: int, nbytes: int) -> None:
        c = out[cls]
        c[0], c[1], c[2] = c[0] + fan_in * fan_out, c[1] + fan_out, c[2] + nbytes

    packed = set()
    if spec.name == "gguf":
        for name, fan_in, fan_out, bits, mins in shape.packed:
            bits = _kernel_bits(bits)
            add(f"q{bits}", fan_in, fan_out, packed_layer_bytes(bits, fan_in, fan_out, dtype, True, bool(mins)))
            packed.add(name)
    for name, fan_in, fan_out, _bias in shape.linears:
        if name in packed:
            continue
        if spec.name in WEIGHT_ONLY and (spec.name == "q8" or fan_in % BLOCK == 0):
            bits = 8 if spec.name == "q8" else 4
            add(f"q{bits}", fan_in, fan_out, packed_layer_bytes(bits, fan_in, fan_out, dtype, True))
        else:
            add("dense", fan_in, fan_out, fan_in * fan_out * b)
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def body_outputs(shape: ModelShape) -> int:
    """A token's outputs over the layers' products (the head runs for a prompt's last token only)."""
    return sum(fan_out for name, _fan_in, fan_out, _bias in shape.linears if name != "lm_head")


def _kernel_step(shape, spec, machine, rates: dict, key: str, read: int) -> tuple[float, float]:
    """One decode token on Redline's CPU kernels: (seconds bound by bytes, seconds bound by arithmetic), summed
    over the weight classes, each the larger of its bytes and its arithmetic plus its rows' fixed cost
    (``ROW_S``); what the products do not read (the KV cache, the embedding row, norms) streams as dense."""
    classes = product_classes(shape, spec, machine.device)
    dense_key = key
    if key in ("q8", "q4"):  # a block precision's dense layers run in its compute dtype
        dense_key = "fp32" if compute_dtype(spec, machine.device) == "float32" else "bf16"
    e = {"dense": rates[dense_key], "q8": rates["q8"], "q4": rates["q4"]}
    bw = machine.bandwidth_bytes_per_s
    products = shape.layers * FAST_PRODUCTS_PER_LAYER + 1
    other = max(0, read - sum(c[2] for c in classes.values()))
    memory_s = other / (bw * e["dense"]) + products * PRODUCT_START_S
    compute_s = 0.0
    for cls, (weights, rows, nbytes) in classes.items():
        if not weights:
            continue
        mem = nbytes / (bw * e[cls])
        arith = 2.0 * weights / (machine.flops * DECODE_ARITHMETIC[cls]) if cls in DECODE_ARITHMETIC else 0.0
        memory_s += rows * ROW_S[cls]
        if arith > mem:
            compute_s += arith
        else:
            memory_s += mem
    return memory_s, compute_s


def _kind(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "cpu"


# --------------------------------------------------------------------------- the machine
@dataclass
class Machine:
    """What the prediction needs to know about where the model runs."""

    device: str  # "cpu" or "cuda"
    bandwidth_bytes_per_s: float
    flops: Optional[float]  # measured matrix-multiply FLOP/s; None where unknown (a card from the list)
    label: str
    calibration_key: Optional[str] = None  # whose learned efficiency applies; None for a hypothetical card

    @property
    def kind(self) -> str:
        return _kind(self.device)

    def to_dict(self) -> dict:
        return asdict(self)


def this_machine(device: str = "cpu") -> Machine:
    """This machine's measured bandwidth and FLOP/s (each measured once, then cached). Imports torch."""

    return Machine(_kind(device), bandwidth(device), flops(device), _label(device), device_key(device))


def cached_machine(device: str = "cpu", key: Optional[str] = None) -> Optional[Machine]:
    """This machine's figures from the caches alone, without torch; None until they were measured once."""

    bw = cached("bandwidth", device)
    if bw is None:
        return None
    return Machine(_kind(device), bw, cached("compute", device), _label(device), key or _kind(device))


def card_machine(name: str, bandwidth_gb_s: float) -> Machine:
    """A GPU from the built-in list: its published bandwidth, no measured FLOP/s, no learned efficiency."""
    return Machine("cuda", bandwidth_gb_s * 1e9, None, f"an {name}", None)


def _label(device: str) -> str:
    if _kind(device) == "cuda":
        return "this GPU"
    return "this CPU"


# --------------------------------------------------------------------------- one step
@dataclass
class StepCost:
    tokens: int
    bytes: int
    flops: float
    memory_s: float
    compute_s: float
    overhead_s: float
    # Whether the parts add up rather than overlap: Redline's kernels run a step's products one after another,
    # each bound by its bytes or by its arithmetic (``_kernel_step``).
    additive: bool = False

    @property
    def seconds(self) -> float:
        if self.additive:
            return self.memory_s + self.compute_s + self.overhead_s
        return max(self.memory_s, self.compute_s) + self.overhead_s

    @property
    def bound(self) -> str:
        parts = {"memory": self.memory_s, "compute": self.compute_s, "overhead": self.overhead_s}
        return max(parts, key=parts.get)


def step_cost(
    shape: ModelShape,
    spec: PrecisionSpec,
    machine: Machine,
    path: str,
    tokens: int = 1,
    context_before: int = 0,
    cache: bool = True,
    kernels: bool = True,
    kv: str = "bf16",
) -> StepCost:
    """One forward pass over ``tokens`` tokens with ``context_before`` positions in the cache (``cache=False``:
    none kept, as naive decoding). ``kernels``: whether Redline's CPU kernels run the fast path's step (False:
    torch's operators run it). ``kv``: the KV cache's form (``cost.KV_FORMS``, "q8" where the fast path keeps it)."""
    kind = machine.kind
    if kind == "cpu" and path == "fast" and not kernels:
        path = "fast-torch"
    rates = MEMORY_EFFICIENCY.get((kind, path)) or MEMORY_EFFICIENCY[(kind, "hf")]
    key = _rate_key(spec, shape)
    e_mem = rates.get(key) or MEMORY_EFFICIENCY[(kind, "hf")].get(key, 0.25)
    read = weights_read_bytes(shape, spec, machine.device)
    read += kv_read_bytes(shape, spec, machine.device, path, context_before, kv) if cache else 0
    fl = step_flops(shape, tokens, context_before)
    # Redline's kernels run the fast path's step ("fast-torch" where they do not): one token, class by class.
    kernel_step = kind == "cpu" and path == "fast" and tokens == 1 and bool(machine.flops)
    if kernel_step:
        memory_s, compute_s = _kernel_step(shape, spec, machine, rates, key, read)
    else:
        memory_s = read / (machine.bandwidth_bytes_per_s * e_mem)
        # One token is a matrix-vector product, which streams its weights: its arithmetic is part of the memory
        # efficiency. Several tokens at once (prefill, verification, naive re-runs) are matrix products.
        compute_s = 0.0
        if machine.flops and tokens > 1:
            work = fl
            if kind == "cpu" and path == "fast":
                work += PROMPT_OUTPUT_FLOPS * tokens * body_outputs(shape)
            compute_s = work / (machine.flops * COMPUTE_EFFICIENCY[kind].get(key, 0.1))
    over = (shape.kv_layers or shape.layers) * LAYER_OVERHEAD_S.get((kind, path), LAYER_OVERHEAD_S[(kind, "hf")])
    over += STEP_OVERHEAD_S.get((kind, path), STEP_OVERHEAD_S[(kind, "hf")])
    return StepCost(tokens, read, fl, memory_s, compute_s, over, additive=kernel_step)


# --------------------------------------------------------------------------- speculative arithmetic
def tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens one speculative step yields with per-token acceptance α and k draft tokens."""
    alpha = min(max(alpha, 0.0), 1.0)
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def token_acceptance(rate: float, k: int) -> float:
    """The per-token acceptance α that gives the measured acceptance rate (accepted ÷ proposed draft tokens)
    when a step accepts the draft's tokens up to the first rejection: rate = α(1 − α^k) ÷ ((1 − α) k)."""
    rate = min(max(rate, 0.0), 1.0)
    if rate in (0.0, 1.0) or k <= 1:
        return rate

    def f(a: float) -> float:
        return (tokens_per_step(a, k) - 1.0) / k

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if f(mid) < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def speculative_speedup(alpha: float, k: int, cost_ratio: float, verify_ratio: float = 1.0) -> float:
    """Speed-up over the target alone: tokens per step ÷ the step's cost in target decode steps
    (k draft steps of ``cost_ratio`` each, one verification of ``verify_ratio``)."""
    return tokens_per_step(alpha, k) / (k * cost_ratio + verify_ratio)


def break_even_acceptance(k: int, cost_ratio: float, verify_ratio: float = 1.0) -> Optional[float]:
    """The per-token acceptance at which speculative decoding starts to pay; None if even α = 1 does not."""
    if speculative_speedup(1.0, k, cost_ratio, verify_ratio) <= 1.0:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if speculative_speedup(mid, k, cost_ratio, verify_ratio) < 1.0:
            lo = mid
        else:
            hi = mid
    return hi


# --------------------------------------------------------------------------- the prediction
@dataclass
class SpeedPrediction:
    config: str
    strategy: str
    precision: str
    path: str  # "fast", "hf" (transformers' generate) or "graph" (compiled, CUDA graphs)
    class_key: str  # the calibration class: strategy:precision
    prompt_tokens: int
    new_tokens: int
    weights_read_bytes: int  # per decode step
    kv_read_bytes: int  # per decode step, at the average context
    bytes_per_token: int
    bandwidth_bytes_per_s: float
    flops: Optional[float]
    roofline_tokens_per_s: float  # bandwidth ÷ bytes per token: the bound at batch 1
    uncorrected_tokens_per_s: float
    uncorrected_ttft_ms: float
    decode_factor: float = 1.0  # learned on this machine (1 until measured)
    ttft_factor: float = 1.0
    calibration: str = "none"  # "class" (this configuration measured here), "device" (others measured), "none"
    calibration_samples: int = 0
    measured_tokens_per_s: Optional[float] = None  # median measured here for this model and class
    measured_samples: int = 0
    bound: str = "memory"  # what limits a decode step: memory, compute or overhead
    acceptance: Optional[float] = None  # speculative: per-token acceptance used
    acceptance_measured: bool = False
    draft_cost_ratio: Optional[float] = None  # speculative: draft step ÷ target step
    notes: list[str] = field(default_factory=list)
    cached_tokens: int = 0  # of the prompt, held by the prefix cache (the TTFT reads only the rest)
    # The prefill's two parts, uncorrected: its products' arithmetic, and what does not grow with the prompt (a
    # read of every weight, the per-layer and per-call overheads). A fit of both from replies of several prompt
    # lengths (``SpeedCalibration.ttft_fit``) corrects each apart; one factor cannot follow the curve.
    ttft_compute_ms: float = 0.0
    ttft_fixed_ms: float = 0.0
    ttft_fit: Optional[tuple[float, float]] = None  # learned (per-FLOP, fixed) factors; None: ttft_factor
    # A reasoning model (``speed/thinking.py``): whether the reply thinks first (None: the model's default), and the
    # typical thinking length learned for this model from its replies here (None: not learned yet), from how many.
    thinking: Optional[bool] = None
    thinking_tokens: Optional[float] = None
    thinking_samples: int = 0

    @property
    def ttfat_ms(self) -> Optional[float]:
        """Time to the first answer token: the TTFT, plus the learned thinking at the decode rate where the reply
        thinks (thinking off: the TTFT). None where it would think but no thinking length is learned yet."""
        if self.thinking is False:
            return self.ttft_ms
        return None if self.thinking_tokens is None else self.ttft_ms + 1000 * self.thinking_tokens / self.tokens_per_s

    @property
    def tokens_per_s(self) -> float:
        return self.uncorrected_tokens_per_s * self.decode_factor

    @property
    def ttft_ms(self) -> float:
        if self.ttft_fit is not None:
            return self.ttft_fit[0] * self.ttft_compute_ms + self.ttft_fit[1] * self.ttft_fixed_ms
        return self.uncorrected_ttft_ms * self.ttft_factor

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tokens_per_s"] = round(self.tokens_per_s, 2)
        d["ttft_ms"] = round(self.ttft_ms, 1)
        d["ttfat_ms"] = None if self.ttfat_ms is None else round(self.ttfat_ms, 1)
        return d

    def text(self, strategy: bool = False) -> str:
        """ "≈ 41 tok/s (fast) · measured here 40" (the strategy when asked), as the wizard's table shows it: a
        decimal below 10 tok/s only, so the column stays narrow."""
        out = f"≈ {fmt_rate(self.tokens_per_s)} tok/s" + (f" ({self.strategy})" if strategy else "")
        if self.measured_tokens_per_s is not None:
            out += f" · measured here {fmt_rate(self.measured_tokens_per_s)}"
        return out

    def tip(self) -> str:
        """What the figure is made of, for a tooltip beside it (the wizard's speed column, the speed lab's
        predicted column): the reply it is for, the bytes a token reads at the bandwidth, the bound, the TTFT, what
        this machine's measurements corrected, and the notes."""
        learned = {
            "class": f"corrected by {self.calibration_samples} measurement(s) of {self.class_key} on this machine",
            "device": f"corrected by what {self.calibration_samples} measurement(s) of other configurations showed "
            "here",
            "none": "not yet corrected by a measurement here (every reply and speed-lab row teaches it)",
        }[self.calibration]
        return (
            f"Decode speed predicted for a {self.new_tokens}-token reply to a {self.prompt_tokens}-token prompt "
            f"with the {self.strategy} strategy: ≈ {fmt_rate(self.tokens_per_s)} tok/s, "
            f"{format_bytes(self.bytes_per_token)} read per token at {self.bandwidth_bytes_per_s / 1e9:.1f} GB/s "
            f"(bound: {self.roofline_tokens_per_s:.0f} tok/s), time to first token ≈ {self.ttft_ms:.0f} ms; "
            + learned
            + "".join(f"; {n}" for n in self.notes)
            + "."
        )


def fmt_rate(value: float) -> str:
    """A rate as the tables show it: whole numbers from 10 up, one decimal below."""
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def class_key(strategy: str, spec: PrecisionSpec, shape: Optional[ModelShape] = None) -> str:
    """The calibration class of a configuration: ``strategy:precision`` (weight-only with fp32 compute apart).
    A GGUF as the file is learns with the precision whose block kernels run it (``gguf_kernels``): a Q8_0 file
    and q8 are the same Q8_0 blocks on the same kernels, so a user's q8 replies correct its prediction too."""
    name = _rate_key(spec, shape) if spec.name == "gguf" and shape is not None else spec.name
    if name in WEIGHT_ONLY and spec.compute_dtype == "fp32":
        name += "+fp32"
    return f"{strategy}:{name}"


def predict(
    shape: ModelShape,
    spec: PrecisionSpec,
    strategy: str,
    machine: Machine,
    prompt_tokens: int = 64,
    new_tokens: int = 128,
    *,
    k: int = 5,
    draft: Optional[ModelShape] = None,
    draft_spec: Optional[PrecisionSpec] = None,
    acceptance: Optional[float] = None,
    compile: Optional[bool] = None,
    config: str = "",
    kernels: Optional[bool] = None,
    cached_tokens: int = 0,
    kv: str = "bf16",
) -> SpeedPrediction:
    """The uncorrected prediction for one configuration (``SpeedModel.predict`` applies the learned factors).

    ``cached_tokens``: the prompt's first positions the prefix cache already holds (the fast path only; at
    least the last prompt token is always read). ``kv`` "q8" (``--kv q8``, the fast path): 8-bit rows of head size + 2.

    ``acceptance`` (speculative): the measured acceptance rate, accepted ÷ proposed draft tokens; None
    assumes ``ASSUMED_ACCEPTANCE`` per token and says so. ``kernels`` (a CPU's fast path): whether Redline's CPU
    kernels run it; None: whether they will here (``kernels.cpu.library.will_run``, which builds nothing), so the
    prediction is of the path that will really run."""
    prompt_tokens, new_tokens = max(1, int(prompt_tokens)), max(1, int(new_tokens))
    base_strategy = "kv" if strategy in ("speculative", "prompt-lookup") else strategy
    path, note = code_path(base_strategy, spec, shape, machine.device, compile)
    notes = [note] if note else []
    if machine.kind == "cpu" and path == "fast":
        if kernels is None:
            kernels = kernels_run(machine.device)
        if not kernels:
            notes.append("Redline's CPU kernels do not run here: predicted on torch's operators")
    kernels = True if kernels is None else kernels
    average = prompt_tokens + new_tokens // 2  # the cache a decode step reads, on average
    decode = step_cost(shape, spec, machine, path, 1, average, kernels=kernels, kv=kv)
    cached = max(0, min(int(cached_tokens), prompt_tokens - 1)) if strategy == "fast" else 0
    prefill = step_cost(shape, spec, machine, path, prompt_tokens - cached, cached, kernels=kernels, kv=kv)
    ttft_s = prefill.seconds + CALL_OVERHEAD_S[path]
    pred_acceptance = draft_ratio = None
    measured_acc = False
    if strategy == "naive":
        # Every step re-runs the whole sequence; decode tokens/s counts the tokens after the first.
        steps = max(1, new_tokens - 1)
        stride = max(1, steps // 256)  # a sum over at most ~256 positions is exact enough
        total = 0.0
        for i in range(1, steps + 1, stride):
            total += step_cost(
                shape, spec, machine, path, prompt_tokens + i, 0, cache=False, kernels=kernels
            ).seconds * min(stride, steps + 1 - i)
        tps = steps / total
        bound = step_cost(shape, spec, machine, path, prompt_tokens + steps // 2, 0, cache=False, kernels=kernels).bound
    elif strategy == "speculative":
        dshape = draft or shape
        dspec = draft_spec or spec
        dpath, _ = code_path("kv", dspec, dshape, machine.device)
        draft_step = step_cost(dshape, dspec, machine, dpath, 1, average)
        verify = step_cost(shape, spec, machine, path, k + 1, average, kernels=kernels, kv=kv)
        if acceptance is None:
            alpha = ASSUMED_ACCEPTANCE
            notes.append(f"acceptance not measured for this pair yet: {ASSUMED_ACCEPTANCE:.0%} per token assumed")
        else:
            alpha = token_acceptance(acceptance, k)
            measured_acc = True
        per_step = k * draft_step.seconds + verify.seconds + SPECULATIVE_STEP_OVERHEAD_S[machine.kind]
        tps = tokens_per_step(alpha, k) / per_step
        pred_acceptance = alpha
        draft_ratio = draft_step.seconds / decode.seconds
        ttft_s += step_cost(dshape, dspec, machine, dpath, prompt_tokens, 0).seconds
        bound = verify.bound
    else:
        tps = 1.0 / decode.seconds
        bound = decode.bound
        if strategy == "prompt-lookup":
            notes.append("prompt lookup's gain depends on how much of the reply the context holds; predicted as kv")
    kv_bytes = kv_read_bytes(shape, spec, machine.device, path, average, kv)
    weights = weights_read_bytes(shape, spec, machine.device)
    return SpeedPrediction(
        config=config or f"{strategy}:{spec.label()}",
        strategy=strategy,
        precision=spec.label(),
        path=path,
        class_key=class_key(strategy, spec, shape),
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        weights_read_bytes=weights,
        kv_read_bytes=kv_bytes,
        bytes_per_token=weights + kv_bytes,
        bandwidth_bytes_per_s=machine.bandwidth_bytes_per_s,
        flops=machine.flops,
        roofline_tokens_per_s=machine.bandwidth_bytes_per_s / (weights + kv_bytes),
        uncorrected_tokens_per_s=tps,
        uncorrected_ttft_ms=1000.0 * ttft_s,
        ttft_compute_ms=1000.0 * prefill.compute_s,
        # What does not grow with the prompt: the call's set-up (and a draft's own prefill), the step's overheads
        # and the weights' read where the arithmetic does not hide it (a prompt's matrix products read the weights
        # while they compute; a step of several tokens is the larger of the two, one token on the kernels their
        # sum). Counting the whole read made a model of many weights and few operations a token, a 1B at 44
        # tokens, 29-42 % too slow after a calibration on the starter. The two parts add up to the uncorrected TTFT.
        ttft_fixed_ms=1000.0 * (ttft_s - prefill.compute_s),
        bound=bound,
        acceptance=pred_acceptance,
        acceptance_measured=measured_acc,
        draft_cost_ratio=draft_ratio,
        notes=notes,
        cached_tokens=cached,
    )


def finite(x: Optional[float]) -> bool:
    return x is not None and math.isfinite(x) and x > 0


def weight_bytes_read(model) -> int:
    """Weight bytes one decode step of a loaded model reads, counted from its tensors: every weight except
    embedding tables (one row each), quantised layers at their packed bytes (blocks included). What the cost
    module predicts from the shape alone (``cost.weights_read_bytes``; a test checks both agree); the KV cache a
    step reads is the cost module's too (``cost.kv_read_bytes``, at the cache's dtype and window)."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    head = getattr(model, "lm_head", None)
    head_weight = getattr(head, "weight", None)
    total = 0
    seen = set()
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        if id(t) in embeddings and (head_weight is None or t is not head_weight):
            total += t.shape[-1] * t.element_size() if t.dim() == 2 else 0
            continue
        total += t.numel() * t.element_size()
    # Block-quantised layers (q8/q4 on the CPU's native kernels) keep their weights in a BlockWeights,
    # which is neither a parameter nor a buffer.
    for m in model.modules():
        blocks = getattr(m, "blocks", None)
        if blocks is not None and hasattr(blocks, "nbytes"):
            total += int(blocks.nbytes)
    return int(total)


def bytes_read_per_token(loaded, strategy: str, context_tokens: int) -> int:
    """Bytes one decode step of ``loaded`` (a LoadedModel) reads with ``context_tokens`` positions cached: its
    weights as held, and the KV cache at the dtype, form (``--kv``) and window the strategy's code path keeps it."""
    shape, kv = loaded_shape(loaded), getattr(getattr(loaded, "limits", None), "kv", "bf16")
    path, _ = code_path(strategy, loaded.precision, shape, loaded.device)
    kv_bytes = kv_read_bytes(shape, loaded.precision, loaded.device, path, context_tokens, kv)
    return weight_bytes_read(loaded.model) + kv_bytes
