"""Precisions Redline can load a model in, and how each maps onto transformers.

fp32/fp16/bf16 are plain dtypes. int8 is bitsandbytes LLM.int8 (outlier
threshold exposed). nf4/fp4 are bitsandbytes 4-bit (compute dtype and double
quantisation exposed). Mixed precision keeps named modules unquantised
(bitsandbytes ``llm_int8_skip_modules``, which also applies to 4-bit).
q8/q4 are weight-only int8/int4 on torch's packed kernels: built for speed at
batch 1 (bitsandbytes is the memory-saving option; its kernels are slow there).
gguf keeps a converted GGUF's quantised layers as the file has them (4 or 8 bits
per layer, on the same kernels); ``auto`` means gguf for such a folder.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from dataclasses import asdict, dataclass, field
from typing import Optional

from .errors import UnsupportedConfiguration

# bitsandbytes warns on every int8 matmul that fp32 inputs are cast; once is plenty.
warnings.filterwarnings("ignore", message=r"MatMul8bitLt: inputs will be cast")


class _Once(logging.Filter):
    """bitsandbytes >= 0.46 says it through logging, once per matmul (thousands per reply)."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix, self.seen = prefix, False

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            return True
        first, self.seen = not self.seen, True
        return first


logging.getLogger("bitsandbytes.autograd._functions").addFilter(_Once("MatMul8bitLt: inputs will be cast"))

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "nf4", "fp4", "q8", "q4", "gguf")
QUANTISED = ("int8", "nf4", "fp4")  # bitsandbytes
WEIGHT_ONLY = ("q8", "q4")  # torch's packed weight-only kernels (inference/loading/weight_only.py)
AS_FILE = "gguf"  # a converted GGUF's quantised layers as stored (inference/loading/packed.py)
DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class PrecisionSpec:
    name: str = "bf16"
    compute_dtype: str = "bf16"  # 4-bit only: dtype the matmuls run in
    double_quant: bool = True  # 4-bit only: quantise the quantisation constants too
    int8_threshold: float = 6.0  # int8 only: outlier threshold (LLM.int8 default)
    skip_modules: tuple[str, ...] = field(default_factory=tuple)  # mixed precision
    auto: bool = False  # the user asked for ``auto``: a folder that keeps a GGUF's quantisation loads as ``gguf``

    def __post_init__(self):
        if self.name not in PRECISIONS:
            raise UnsupportedConfiguration(
                f"Unknown precision {self.name!r}.", f"Choose one of: {', '.join(PRECISIONS)}."
            )
        if self.compute_dtype not in DTYPE_NAMES:
            raise UnsupportedConfiguration(
                f"Unknown compute dtype {self.compute_dtype!r}.", "Choose fp32, fp16 or bf16."
            )

    @property
    def quantised(self) -> bool:
        return self.name in QUANTISED

    def label(self) -> str:
        text = self.name
        if self.name == AS_FILE:
            text += " (as the file is)"
        if self.skip_modules:
            text += " (keeps " + ",".join(self.skip_modules) + ")"
        return text

    def to_dict(self) -> dict:
        d = asdict(self)
        d["skip_modules"] = list(self.skip_modules)
        return d


def parse_precision(text: str, **overrides) -> PrecisionSpec:
    """Parse ``nf4``, ``int8``, ``nf4+keep=lm_head,embed_tokens`` and the like."""
    name, _, rest = text.strip().lower().partition("+")
    kwargs = dict(overrides)
    if rest:
        for part in rest.split("+"):
            key, _, value = part.partition("=")
            if key in ("keep", "skip"):
                kwargs["skip_modules"] = tuple(v for v in value.split(",") if v)
            elif key == "compute":
                kwargs["compute_dtype"] = value
            elif key == "dq":
                kwargs["double_quant"] = value not in ("0", "false", "no", "off")
            elif key == "threshold":
                kwargs["int8_threshold"] = float(value)
            else:
                raise UnsupportedConfiguration(
                    f"Unknown precision option {key!r} in {text!r}.", "Known: keep=, compute=, dq=, threshold=."
                )
    return PrecisionSpec(name=name, **kwargs)


def default_precision(device: str) -> str:
    """What ``auto`` means: bf16 where the hardware has it (half the bytes of fp32), else fp16 on GPUs."""
    if device.startswith("cuda"):
        # lazy: torch loads on the engine's thread, never at import
        import torch

        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16"


def resolve_precision(text: str, device: str) -> PrecisionSpec:
    """Parse a precision as the user wrote it, ``auto`` (and ``auto+keep=…``) included, for ``device``."""
    name, plus, rest = text.strip().partition("+")
    if name.lower() == "auto":
        return parse_precision(default_precision(device) + plus + rest, auto=True)
    return parse_precision(text)


def torch_dtype(name: str):
    # lazy: torch loads on the engine's thread, never at import
    import torch

    return getattr(torch, DTYPE_NAMES[name])


def bitsandbytes_available() -> bool:
    return importlib.util.find_spec("bitsandbytes") is not None


def check_supported(spec: PrecisionSpec, device: str) -> Optional[str]:
    """Raise UnsupportedConfiguration if this machine cannot run ``spec``; return a warning or None."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    if spec.quantised:
        if not bitsandbytes_available():
            raise UnsupportedConfiguration(
                f"{spec.name} needs bitsandbytes, which is not installed.",
                "Install it with `pip install bitsandbytes`, or choose fp16/bf16/fp32.",
            )
        try:
            import bitsandbytes  # noqa: F401
        except Exception as exc:
            raise UnsupportedConfiguration(
                f"bitsandbytes is installed but does not load on this machine ({exc}).",
                "Choose fp16, bf16 or fp32, or reinstall bitsandbytes for your CUDA version.",
            ) from exc
    if spec.name in ("q4", AS_FILE) and spec.compute_dtype != "bf16":
        raise UnsupportedConfiguration(
            f"{spec.name} computes in bf16 only (torch's int4 kernels).",
            f"Use {spec.name} or {spec.name}+compute=bf16.",
        )
    if device.startswith("cuda"):
        refusal = cuda_refusal(spec, torch.cuda.get_device_capability(device))
        if refusal is None and spec.name == "q8":
            refusal = _int8_kernel_refusal(device)
        if refusal is not None:
            raise refusal
        return None
    if spec.name == "fp16":
        return "fp16 runs slowly on most CPUs; bf16 or fp32 is usually faster there."
    return None


# bf16 arithmetic and torch's int4 (tinygemm) kernel need an Ampere card or newer (compute capability 8.0). On an
# RTX 20-series card torch.cuda.is_bf16_supported() still says yes (it counts emulation), and the model runs many
# times slower than in fp16: refused here with the precision that runs instead.
AMPERE = (8, 0)


def cuda_refusal(spec: PrecisionSpec, capability: tuple[int, int]) -> Optional[UnsupportedConfiguration]:
    """Why ``spec`` cannot run well on a CUDA card of ``capability`` (major, minor), or None."""
    card = f"compute capability {capability[0]}.{capability[1]}"
    computes_bf16 = spec.name == "bf16" or (
        (spec.quantised or spec.name in WEIGHT_ONLY or spec.name == AS_FILE) and spec.compute_dtype == "bf16"
    )
    if spec.name in ("q4", AS_FILE) and tuple(capability) < AMPERE:
        return UnsupportedConfiguration(
            f"{spec.name} runs on torch's int4 kernel, which needs an Ampere (RTX 30) card or newer; this GPU is "
            f"{card}.",
            "Choose nf4 (bitsandbytes 4-bit, compute=fp16), int8 or fp16.",
        )
    if computes_bf16 and tuple(capability) < AMPERE:
        return UnsupportedConfiguration(
            f"This GPU ({card}) has no bf16 arithmetic: torch would emulate it, many times slower than fp16.",
            "Choose fp16 (or a 4-bit precision with compute=fp16).",
        )
    return None


def _int8_kernel_refusal(device: str) -> Optional[UnsupportedConfiguration]:
    """q8's product is torch's ``_weight_int8pack_mm``; older torch builds have no CUDA kernel for it. Asked of the
    card itself, once, with a product of one row."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    try:
        x = torch.ones(1, 32, device=device, dtype=torch.bfloat16)
        w = torch.ones(8, 32, device=device, dtype=torch.int8)
        torch._weight_int8pack_mm(x, w, torch.ones(8, device=device, dtype=torch.bfloat16))
    except (RuntimeError, NotImplementedError) as exc:
        return UnsupportedConfiguration(
            f"q8 needs torch's int8 weight kernel on CUDA, which this torch ({torch.__version__}) lacks ({exc}).",
            "Upgrade torch (pip install -U torch), or choose int8 (bitsandbytes), q4 or bf16.",
        )
    return None


def from_pretrained_kwargs(spec: PrecisionSpec, device: str) -> dict:
    """Keyword arguments for ``AutoModelForCausalLM.from_pretrained``."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    if spec.name == AS_FILE:
        raise UnsupportedConfiguration(
            "The gguf precision loads a folder converted from a quantised GGUF file; this model holds float weights.",
            "Choose auto, bf16, fp16, fp32, q8, q4, int8 or nf4.",
        )
    if spec.name in WEIGHT_ONLY:
        # Loaded in host memory in the compute dtype, then packed layer by layer onto the device
        # (loader.py), so the GPU never holds the unquantised copy.
        return {"dtype": torch_dtype(spec.compute_dtype), "device_map": "cpu"}
    if not spec.quantised:
        return {"dtype": torch_dtype(spec.name), "device_map": device}
    # lazy: transformers loads on the engine's thread, never at import
    from transformers import BitsAndBytesConfig

    skip = list(spec.skip_modules) or None
    if spec.name == "int8":
        q = BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=spec.int8_threshold, llm_int8_skip_modules=skip)
        # Non-quantised parts (norms, embeddings) stay in half precision on a GPU, as
        # bitsandbytes expects; on CPU half-precision element-wise ops are slow, so fp32.
        dtype = torch.float16 if device.startswith("cuda") else torch.float32
    else:
        q = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=spec.name,
            bnb_4bit_compute_dtype=torch_dtype(spec.compute_dtype),
            bnb_4bit_use_double_quant=spec.double_quant,
            llm_int8_skip_modules=skip,
        )
        dtype = torch_dtype(spec.compute_dtype)
    return {"quantization_config": q, "dtype": dtype, "device_map": device}
