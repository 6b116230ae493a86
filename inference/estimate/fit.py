"""Will it fit? Available memory, and the configuration to suggest.

A configuration *fits* when its predicted total plus the estimate's own error
bound (10 % or 300 MB) is at most the memory available, so "fits" holds even
when the prediction is off by as much as it may be.

The suggestion ranks bf16 (fp16 on cards without bf16), then int8, then nf4,
with q8 among them where Redline's CPU kernels run it (``cost.kernels_run``),
in the order of their weights' bytes: highest precision first; then, for that
precision, the longest context. For a GGUF whose layers stay quantised it ranks
gguf (as the file is), then q4. fp32 (twice the memory of bf16 for no gain at
inference) and fp4 (the same memory as nf4, lower quality) are estimated but
never suggested.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

import psutil

from ..cost import code_path, kernels_run, weights_bytes
from ..hardware.gpus import find_gpu, gpu_for_memory
from ..hardware.probe import _nvml_gpus
from ..precision import PRECISIONS, PrecisionSpec, parse_precision
from ..units import format_bytes
from .estimator import GB, Estimate, ModelShape, estimate

SUGGESTED = ("bf16", "int8", "nf4")
SUGGESTED_WITH_KERNELS = ("q8",)  # where Redline's CPU kernels run (GGUF's Q8_0 blocks), placed by its bytes
# A GGUF whose layers stay quantised: as the file is first, then everything at 4 bits. bitsandbytes is not
# offered (it quantises from a float checkpoint, which such a conversion does not hold).
SUGGESTED_PACKED = ("gguf", "q4")
PACKED_PRECISIONS = ("gguf", "fp32", "fp16", "bf16", "q8", "q4")


def precisions_for(shape: ModelShape) -> list[str]:
    """The precisions ``shape`` can be loaded in, for an estimate of each."""

    if shape.packed:
        return list(PACKED_PRECISIONS)
    return [p for p in PRECISIONS if p != "gguf"]


MIN_CONTEXT = 256  # shorter than this is not a useful chat
# The context planned for where none is set (``auto``, ``redline estimate``, the wizard, a load's out-of-memory
# message): the model's own, at most this.
DEFAULT_CONTEXT_CAP = 8192


@dataclass
class Target:
    """Where the model would run and how much memory it may use there."""

    device: str  # "cpu" or "cuda"
    available_bytes: int
    label: str  # "this GPU (NVIDIA GeForce RTX 4090)", "an RTX 3060 12GB", "this machine's free RAM"
    calibration_key: Optional[str] = None  # whose learned correction applies; None for a hypothetical card
    bf16: bool = True
    bandwidth_gb_s: Optional[float] = None
    what: str = "this machine has"  # completes "X more than …"

    def to_dict(self) -> dict:
        return asdict(self)


def _nvml_bf16(index: int) -> Optional[bool]:
    try:
        # lazy: pynvml is read only where a GPU may be
        import pynvml

        pynvml.nvmlInit()
        try:
            major, _ = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(index))
            return major >= 8
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def _read_int(path: str) -> Optional[int]:
    try:
        text = open(path, encoding="ascii").read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def process_memory_limit() -> Optional[tuple[int, str]]:
    """What this process may still allocate when something tighter than the machine's free RAM binds it: an
    address-space limit (``ulimit -v``, RLIMIT_AS; its headroom is the limit less the address space already
    mapped) or a container's memory limit (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``)."""
    limits: list[tuple[int, str]] = []
    try:
        # lazy: it may be missing or fail to load here, which the handler below says
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY and soft > 0:
            vms = psutil.Process().memory_info().vms
            limits.append((max(0, soft - vms), "this process's address-space limit (ulimit -v)"))
    except (ImportError, OSError, ValueError):
        pass  # no RLIMIT_AS here (Windows)
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < (1 << 60):
            limits.append((max(0, limit - usage), "this container's memory limit"))
            break
    return min(limits) if limits else None


def detect_target(
    free_gb: Optional[float] = None, gpu: Optional[str] = None, reclaimable_bytes: int = 0, device: Optional[str] = None
) -> Target:
    """The memory to plan with.

    ``gpu``: a card from the built-in list (its whole memory). Otherwise the
    first CUDA device's free memory as NVML reports it (other processes' use
    already subtracted), or torch's where NVML is missing; on CPU, available RAM.
    ``free_gb`` overrides the amount. ``reclaimable_bytes``: memory the model
    loaded now would give back when replaced.
    """
    if gpu:
        card = find_gpu(gpu)
        avail = int(free_gb * GB) if free_gb is not None else card.memory_bytes
        return Target("cuda", avail, f"an {card.name}", None, card.bf16, card.bandwidth_gb_s, f"an {card.name} has")

    gpus = [] if device == "cpu" else _nvml_gpus()
    if gpus and gpus[0].free_bytes is not None:
        g = gpus[0]
        avail = g.free_bytes
        bf16 = _nvml_bf16(g.index)
        label = f"this GPU ({g.name})"
    elif device is not None and device.startswith("cuda"):
        # lazy: torch loads on the engine's thread, never at import
        import torch

        free, _total = torch.cuda.mem_get_info()
        g = None
        avail, bf16, label = int(free), torch.cuda.is_bf16_supported(), f"this GPU ({torch.cuda.get_device_name()})"
    else:
        vm = psutil.virtual_memory()
        if free_gb is not None:
            avail = int(free_gb * GB)
            return Target("cpu", avail, "this machine's free RAM", "cpu", True, None, "this machine has free")
        avail = int(vm.available) + reclaimable_bytes
        limit = process_memory_limit()
        if limit is not None and limit[0] + reclaimable_bytes < avail:
            return Target("cpu", limit[0] + reclaimable_bytes, limit[1], "cpu", True, None, "that limit leaves")
        return Target("cpu", avail, "this machine's free RAM", "cpu", True, None, "this machine has free")
    if free_gb is not None:
        avail = int(free_gb * GB)
    else:
        avail += reclaimable_bytes
    name = g.name if g is not None else label[len("this GPU (") : -1]
    return Target("cuda", avail, label, "cuda:" + name, True if bf16 is None else bool(bf16), None, "this GPU has free")


@dataclass
class Option:
    precision: str
    context: int
    draft: bool
    total_bytes: int
    spare_bytes: int  # available − total
    change: Optional[str]  # None, "precision", "context", "draft", "hardware"
    text: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Suggestion:
    text: str
    precision: Optional[str]
    context: Optional[int]
    draft: bool
    change: Optional[str] = None
    max_context: Optional[int] = None  # the longest context the suggested precision fits
    options: list[Option] = field(default_factory=list)  # runners-up / other single changes

    def to_dict(self) -> dict:
        d = asdict(self)
        d["options"] = [o.to_dict() for o in self.options]
        return d


class Planner:
    """Estimates for one model on one target, with the fit rule applied. ``kv``: the KV cache's form (``--kv``,
    ``cost.KV_FORMS``), which only the fast path keeps in 8 bits: an estimate for another strategy counts bf16."""

    def __init__(
        self,
        shape: ModelShape,
        target: Target,
        batch: int = 1,
        draft: Optional[ModelShape] = None,
        draft_spec: Optional[PrecisionSpec] = None,
        correction_bytes: int = 0,
        kv: str = "bf16",
    ):
        self.shape, self.target, self.batch = shape, target, batch
        self.draft, self.draft_spec, self.correction = draft, draft_spec, correction_bytes
        self.kv = kv

    def with_kv(self, kv: str) -> "Planner":
        """The same plan with the KV cache in another form."""
        return Planner(self.shape, self.target, self.batch, self.draft, self.draft_spec, self.correction, kv)

    def estimate(
        self, spec: PrecisionSpec, context: int, with_draft: bool = True, strategy: Optional[str] = None
    ) -> Estimate:
        return estimate(
            self.shape,
            spec,
            context,
            self.batch,
            self.target.device,
            draft=self.draft if with_draft else None,
            draft_spec=self.draft_spec,
            correction_bytes=self.correction,
            available_bytes=self.target.available_bytes,
            strategy=strategy,
            kv=self.kv_form(spec, strategy),
        )

    def kv_form(self, spec: PrecisionSpec, strategy: Optional[str] = None) -> str:
        """The form the KV cache takes for ``spec`` run by ``strategy`` (None: the fast path where it runs it):
        ``kv`` where the fast path keeps the cache, bf16 where transformers does."""
        if strategy not in (None, "fast") or code_path("fast", spec, self.shape, self.target.device)[0] != "fast":
            return "bf16"
        return self.kv

    def fits(self, spec: PrecisionSpec, context: int, with_draft: bool = True) -> bool:
        return bool(self.estimate(spec, context, with_draft).fits)

    def longest_context(self, spec: PrecisionSpec, with_draft: bool = True) -> int:
        """The longest context (up to the model's) that fits; 0 if none does."""
        lo, hi = 0, self.shape.max_positions
        if self.fits(spec, hi, with_draft):
            return hi
        while lo < hi:  # fits() is monotonic in the context
            mid = (lo + hi + 1) // 2
            if self.fits(spec, mid, with_draft):
                lo = mid
            else:
                hi = mid - 1
        return lo


def suggested_ladder(shape: ModelShape, device: str, half: str = "bf16") -> list[str]:
    """The precisions the memory suggestion tries, in turn: bf16 (``half``), int8 and nf4, and q8 where Redline's
    kernels run, most weight bytes first (the starter: bf16 269 MB, int8 220 MB, q8 200 MB, nf4 111 MB)."""
    names = [half if p == "bf16" else p for p in SUGGESTED]
    names += list(SUGGESTED_WITH_KERNELS) if kernels_run(device) else []
    return sorted(names, key=lambda p: -weights_bytes(shape, parse_precision(p), device).total)


def suggest(planner: Planner, context: int, precision: Optional[str] = None) -> Suggestion:
    """The best configuration that fits, its runners-up, or the single changes that would make it fit.

    ``precision``: the user's choice, if any; only it and lower precisions are considered.
    """
    t = planner.target
    half = "bf16" if t.bf16 else "fp16"
    ladder = list(SUGGESTED_PACKED) if planner.shape.packed else suggested_ladder(planner.shape, t.device, half)
    if precision and precision not in ("all", "auto"):
        name = parse_precision(precision).name
        name = {"bf16": half, "fp16": half, "fp32": half, "fp4": "nf4"}.get(name, name)
        ladder = ladder[ladder.index(name) :] if name in ladder else ladder
        if precision.split("+")[0] not in ladder:
            ladder = [precision] + ladder
    specs = [parse_precision(p) for p in ladder]
    has_draft = planner.draft is not None
    draft_words = " with the draft" if has_draft else ""

    def short(e: Estimate, p: str) -> str:
        gap = e.total_bytes - t.available_bytes
        if gap > 0:
            return f"{p} would need {format_bytes(e.total_bytes)}, {format_bytes(gap)} more than {t.what}"
        return (
            f"{p} would need {format_bytes(e.total_bytes)} of the {format_bytes(t.available_bytes)} available, "
            "too close to be "
            f"safe (the estimate may be off by {format_bytes(e.margin_bytes)})"
        )

    est = [planner.estimate(s, context) for s in specs]
    fitting = [i for i, e in enumerate(est) if e.fits]
    if fitting:
        i = fitting[0]
        best, e = ladder[i], est[i]
        max_ctx = planner.longest_context(specs[i])
        spare = format_bytes(t.available_bytes - e.total_bytes)
        text = f"{best}{draft_words} fits with {spare} to spare at {context} tokens"
        if max_ctx > context:
            text += f" (and would fit up to {max_ctx} tokens)"
        above = [short(est[j], ladder[j]) for j in range(i)]
        text += ("; " + "; ".join(above) if above else "") + "."
        options = [
            Option(
                ladder[j],
                context,
                has_draft,
                est[j].total_bytes,
                t.available_bytes - est[j].total_bytes,
                None,
                f"{ladder[j]} also fits, with {format_bytes(t.available_bytes - est[j].total_bytes)} to spare.",
            )
            for j in fitting[1:]
        ]
        return Suggestion(
            text, best, context, has_draft, "precision" if i > 0 and precision else None, max_ctx, options
        )

    # Nothing fits as asked: list each single change that would make it fit.
    options: list[Option] = []
    lowest = specs[-1]
    if has_draft:
        for p, s in zip(ladder, specs):
            e = planner.estimate(s, context, with_draft=False)
            if e.fits:
                options.append(
                    Option(
                        p,
                        context,
                        False,
                        e.total_bytes,
                        t.available_bytes - e.total_bytes,
                        "draft",
                        f"Without the draft model, {p} fits at {context} tokens with "
                        f"{format_bytes(t.available_bytes - e.total_bytes)} to spare.",
                    )
                )
                break
    for p, s in zip(ladder, specs):
        ctx = planner.longest_context(s)
        if ctx >= min(context, MIN_CONTEXT):
            e = planner.estimate(s, ctx)
            options.append(
                Option(
                    p,
                    ctx,
                    has_draft,
                    e.total_bytes,
                    t.available_bytes - e.total_bytes,
                    "context",
                    f"With a context of {ctx} tokens instead of {context}, {p}{draft_words} fits.",
                )
            )
            break
    e_low = est[-1]
    if options:
        first = options[0]
        text = (
            f"Nothing fits at {context} tokens{draft_words}: even {ladder[-1]} needs {format_bytes(e_low.total_bytes)} "
            f"and only {format_bytes(t.available_bytes)} is available ({t.label}). {first.text}"
        )
        return Suggestion(
            text,
            first.precision,
            first.context,
            first.draft,
            first.change,
            planner.longest_context(parse_precision(first.precision), first.draft),
            options[1:],
        )
    small = min(context, MIN_CONTEXT)
    e_small = planner.estimate(lowest, small)
    text = (
        f"Nothing fits: even {ladder[-1]} at {small} tokens needs about {format_bytes(e_small.total_bytes)} plus a "
        f"{format_bytes(e_small.margin_bytes)} safety margin, and only {format_bytes(t.available_bytes)} is available "
        f"({t.label})."
    )
    # The card to name: the smallest in the list on which the lowest precision fits at the asked context.
    on_gpu = estimate(
        planner.shape, lowest, context, planner.batch, "cuda", draft=planner.draft, draft_spec=planner.draft_spec
    )
    card = gpu_for_memory(on_gpu.total_bytes + on_gpu.margin_bytes)
    if card is not None:
        text += (
            f" A GPU with {card.memory_gb_label} or more, such as an {card.name}, would run it at "
            f"{ladder[-1]} with {context} tokens."
        )
    else:
        text += " No consumer GPU in the built-in list has enough memory; choose a smaller model."
    return Suggestion(text, None, None, has_draft, "hardware", None, [])
