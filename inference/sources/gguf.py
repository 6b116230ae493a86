"""Convert a GGUF file into a transformers folder, once, tensor by tensor.

``gguf.GGUFReader`` memory-maps the file; each tensor is read, converted and handed to the shard writer
in turn, and its mapped pages are dropped again, so the conversion holds a few tensors at a time (a shard
being filled, the tensor being converted and its float32 de-quantisation), never the model:

- quantised linear weights stay quantised where Redline has a kernel (``gguf_tensors``: Q8_0 → 8 bits,
  Q4_0/Q4_1/Q4_K → 4 bits, other quantised types → 8 bits) and are listed in ``redline_quantization.json``
  (``inference/loading/packed.py``); ``keep_quantised=False`` de-quantises them instead (the starter);
- everything else is de-quantised with the ``gguf`` package and written as **bf16** (fp16 where the file's
  weights are fp16; ``dtype="float32"`` on request); 1-D float32 tensors (norms, biases) stay float32.

The config, tokenizer and chat template come from the GGUF metadata through transformers' own GGUF
helpers, as do the tensor names (``get_gguf_hf_weights_map``) and the per-architecture fix-ups
(``TENSOR_PROCESSORS``; for Llama-family attention, the Q/K row permutation llama.cpp applies is undone
on quantised blocks by reordering their rows). The folder is written under a temporary name and renamed
when complete.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import mmap
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import Cancelled, ModelLoadError, OutOfMemory, RedlineError
from ..memory.oom import is_oom
from ..memory.policy import returning_freed_memory, weights_in_own_mappings
from ..paths import models_dir
from ..progress import CancelFn, ProgressFn, check_cancel, noop_progress
from ..units import MB, format_bytes
from .manifest import write_manifest

COMPLETE_MARKER = ".redline-complete"
CONVERSION_VERSION = 2  # 1: whole-model fp32 through transformers; 2: streamed, bf16, quantised kept
MIN_SHARD_BYTES = 1 * MB  # tiny models: not one shard per tensor
FLOAT_NAMES = {"float32": 4, "bfloat16": 2, "float16": 2}


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE_MARKER).exists() and (folder / "config.json").exists()


def cache_folder_for(gguf_path: Path) -> Path:
    """A stable cache folder per GGUF file (name + size + mtime + conversion version), so edits reconvert."""
    st = gguf_path.stat()
    key = f"{gguf_path.resolve()}|{st.st_size}|{int(st.st_mtime)}|v{CONVERSION_VERSION}"
    return models_dir() / "gguf" / f"{gguf_path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


# --------------------------------------------------------------------------- the plan (metadata only)
@dataclass
class TensorPlan:
    gguf_name: str
    qtype: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: (rows, cols) for a matrix
    data_bytes: int  # bytes in the file
    hf_name: Optional[str]  # None when the architecture's processor decides (e.g. merged MoE experts)
    packed_module: Optional[str] = None  # the linear module this tensor feeds, when kept quantised
    bits: int = 0
    mins: bool = False  # 4-bit asymmetric blocks (Q4_1, Q4_K)
    how: str = ""
    row_heads: Optional[int] = None  # heads to undo llama.cpp's Q/K permutation with
    streamed: bool = False  # the processor leaves it as it is (or only reorders rows): de-quantised in row chunks
    out_dtype: str = "bfloat16"  # float output
    out_bytes: int = 0


@dataclass
class GGUFPlan:
    path: Path
    architecture: str
    config: Any  # transformers PretrainedConfig
    gguf_config: dict  # the parsed config transformers' processors expect
    float_dtype: str
    tensors: list[TensorPlan] = field(default_factory=list)
    tied_head: Optional[TensorPlan] = None  # lm_head packed from token_embd's blocks (tied embeddings)
    processor: Any = None
    mapping: dict = field(default_factory=dict)

    @property
    def file_bytes(self) -> int:
        return sum(t.data_bytes for t in self.tensors)

    @property
    def output_bytes(self) -> int:
        return sum(t.out_bytes for t in self.tensors) + (self.tied_head.out_bytes if self.tied_head else 0)

    def packed(self) -> list[TensorPlan]:
        return [t for t in self.tensors if t.packed_module] + ([self.tied_head] if self.tied_head else [])

    def type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.qtype.name] = counts.get(t.qtype.name, 0) + 1
        return counts


def _read_error(path: Path, exc: BaseException) -> ModelLoadError:
    return ModelLoadError(
        f"Could not read GGUF file {path.name} ({type(exc).__name__}: {exc}).",
        "The file may be truncated (download it again) or of an architecture transformers cannot convert; "
        "try the model's Hugging Face folder instead.",
    )


def open_reader(path: Path):
    # lazy: the GGUF reader loads only for GGUF files
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError/KeyError/struct errors on damaged files
        raise _read_error(path, exc) from exc


_patch_lock = threading.Lock()


@contextlib.contextmanager
def reusing_reader(path: Path, reader):
    """Within this block transformers' GGUF helpers (config, tokenizer, tensor names) use ``reader`` instead of
    parsing the file again (each parse of a 49k-token vocabulary takes seconds), and gguf's tensor-name map
    is built once instead of once per module. Both helpers import these names from ``gguf`` when called."""
    # lazy: the GGUF reader loads only for GGUF files
    import gguf

    target = str(Path(path).resolve())
    original_reader, original_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def reader_for(p, *args, **kwargs):
        if not args and not kwargs and str(Path(p).resolve()) == target:
            return reader
        return original_reader(p, *args, **kwargs)

    with _patch_lock:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_for, functools.lru_cache(maxsize=None)(original_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = original_reader, original_map


def _choose_float_dtype(reader, requested: Optional[str]) -> str:
    if requested is not None:
        if requested not in FLOAT_NAMES:
            raise ModelLoadError(
                f"Unknown dtype {requested!r} for a GGUF conversion.", "Use bfloat16, float16 or float32."
            )
        return requested
    # lazy: the GGUF reader loads only for GGUF files
    from gguf import GGMLQuantizationType as T

    matrix_types = {t.tensor_type for t in reader.tensors if len(t.shape) >= 2}
    return "float16" if matrix_types == {T.F16} else "bfloat16"


def plan_gguf(path: Path, keep_quantised: bool = True, dtype: Optional[str] = None, reader=None) -> GGUFPlan:
    """What each tensor of ``path`` becomes, from the metadata alone (no weights are read)."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    # lazy: transformers loads on the engine's thread, never at import
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    # lazy: transformers loads on the engine's thread, never at import
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        LlamaTensorProcessor,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
    )

    # lazy: gguf_tensors imports numpy (numpy loads with the engine, not at import)
    from . import gguf_tensors as gt

    path = Path(path)
    reader = reader if reader is not None else open_reader(path)
    try:
        with reusing_reader(path, reader):
            parsed = load_gguf_checkpoint(str(path), return_tensors=False)
        # As AutoConfig.from_pretrained(gguf_file=...) builds it, without parsing the metadata a second time.
        config = CONFIG_MAPPING[parsed["config"]["model_type"]].from_dict(dict(parsed["config"]))
    except Exception as exc:
        raise _read_error(path, exc) from exc
    arch_field = reader.fields.get("general.architecture")
    architecture = str(arch_field.contents()) if arch_field is not None else config.model_type
    gguf_config = parsed.get("config", {})
    processor_cls = TENSOR_PROCESSORS.get(architecture, TensorProcessor)
    processor = processor_cls(config=gguf_config)
    try:
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(config)
        with reusing_reader(path, reader):
            mapping = get_gguf_hf_weights_map(meta, processor)
        config.architectures = [type(meta).__name__]
    except Exception as exc:
        raise ModelLoadError(
            f"{path.name}: transformers cannot build a causal language model of architecture {architecture!r} "
            f"({type(exc).__name__}: {exc}).",
            "Choose a model of a supported architecture, or upgrade transformers.",
        ) from exc
    # Which processors leave linear weights as they are in the file (or only reorder their rows).
    identity_for_linears = processor_cls is TensorProcessor or processor_cls.__name__ in (
        "Gemma2TensorProcessor",
        "NemotronTensorProcessor",
        "LlamaTensorProcessor",
    )
    float_dtype = _choose_float_dtype(reader, dtype)
    heads = gguf_config.get("num_attention_heads")
    kv_heads = gguf_config.get("num_key_value_heads")
    plan = GGUFPlan(path, architecture, config, gguf_config, float_dtype, processor=processor, mapping=mapping)
    modules = dict(meta.named_modules())
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist())) if hasattr(t.shape, "tolist") else tuple(t.shape)
        numel = 1
        for s in shape:
            numel *= s
        hf_name = mapping.get(t.name)
        tp = TensorPlan(t.name, t.tensor_type, shape, int(t.n_bytes), hf_name)
        module = modules.get(hf_name[: -len(".weight")]) if hf_name and hf_name.endswith(".weight") else None
        if (
            keep_quantised
            and identity_for_linears
            and type(module) is torch.nn.Linear
            and len(shape) == 2
            and tuple(module.weight.shape) == shape
            and gt.can_keep(t.tensor_type, *shape)
        ):
            tp.packed_module = hf_name[: -len(".weight")]
            tp.bits, tp.how = gt.kept_as(t.tensor_type)
            tp.mins = tp.bits == 4 and gt.asymmetric(t.tensor_type)
            tp.out_bytes = gt.block_weights_bytes(t.tensor_type, *shape)
        else:
            # lazy: the GGUF reader loads only for GGUF files
            from gguf import GGMLQuantizationType as T

            tp.out_dtype = "float32" if (len(shape) == 1 and t.tensor_type == T.F32) else float_dtype
            tp.out_bytes = numel * FLOAT_NAMES[tp.out_dtype]
        if issubclass(processor_cls, LlamaTensorProcessor) and heads and kv_heads and len(shape) == 2:
            if ".attn_q." in t.name:
                tp.row_heads = int(heads)
            elif ".attn_k." in t.name:
                tp.row_heads = int(kv_heads)
        tp.streamed = identity_for_linears and not (
            processor_cls.__name__ in ("Gemma2TensorProcessor", "NemotronTensorProcessor") and "norm" in t.name
        )
        plan.tensors.append(tp)
    # Tied embeddings: the output head reads the same table; keep a packed copy of it for the head, as
    # llama.cpp computes the logits from the quantised table (the embedding itself stays a float lookup).
    head = meta.get_output_embeddings()
    head_name = next((n for n, m in modules.items() if m is head), None)
    embed = next((t for t in plan.tensors if mapping.get(t.gguf_name, "").endswith("embed_tokens.weight")), None)
    if (
        keep_quantised
        and getattr(config, "tie_word_embeddings", False)
        and type(head) is torch.nn.Linear
        and head_name
        and embed is not None
        and not any(t.hf_name == f"{head_name}.weight" for t in plan.tensors)
        and tuple(head.weight.shape) == embed.shape
        and gt.can_keep(embed.qtype, *embed.shape)
    ):
        bits, how = gt.kept_as(embed.qtype)
        plan.tied_head = TensorPlan(
            embed.gguf_name,
            embed.qtype,
            embed.shape,
            0,
            f"{head_name}.weight",
            packed_module=head_name,
            bits=bits,
            mins=bits == 4 and gt.asymmetric(embed.qtype),
            how=how,
            out_bytes=gt.block_weights_bytes(embed.qtype, *embed.shape),
        )
    return plan


# --------------------------------------------------------------------------- writing
class ShardWriter:
    """safetensors shards of at most ``limit`` bytes (a tensor larger than that gets a shard of its own), so
    the conversion holds one shard's worth of tensors; ``close`` names them and writes the index."""

    def __init__(self, folder: Path, limit: int):
        self.folder, self.limit = folder, limit
        self.pending: dict[str, Any] = {}
        self.pending_bytes = 0
        self.files: list[tuple[Path, list[str]]] = []
        self.total = 0

    def add(self, name: str, tensor) -> None:
        tensor = tensor.contiguous()
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.limit:
            self.flush()
        self.pending[name] = tensor
        self.pending_bytes += size
        self.total += size

    def flush(self) -> None:
        # lazy: safetensors loads only when this runs
        from safetensors.torch import save_file

        if not self.pending:
            return
        path = self.folder / f"model-part-{len(self.files) + 1:05d}.safetensors"
        save_file(self.pending, str(path), metadata={"format": "pt"})
        self.files.append((path, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> None:
        self.flush()
        if len(self.files) == 1:
            self.files[0][0].rename(self.folder / "model.safetensors")
            return
        n = len(self.files)
        weight_map = {}
        for i, (path, names) in enumerate(self.files, 1):
            final = self.folder / f"model-{i:05d}-of-{n:05d}.safetensors"
            path.rename(final)
            weight_map.update({k: final.name for k in names})
        index = {"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))}
        (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")


def _release_pages(reader, tensor) -> None:
    """Drop the mapped pages of a tensor already converted: they would otherwise stay in this process's
    resident memory until the file is closed (on Linux and macOS; elsewhere the OS trims them itself)."""
    mm = getattr(reader.data, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = (int(tensor.data_offset) // mmap.PAGESIZE) * mmap.PAGESIZE
    try:
        mm.madvise(mmap.MADV_DONTNEED, start, int(tensor.data_offset) + int(tensor.n_bytes) - start)
    except (OSError, ValueError):
        pass


class _Progress:
    """Bytes done, rate and time left, mapped onto [lo, hi] of the caller's progress."""

    def __init__(self, progress: ProgressFn, total: int, lo: float, hi: float):
        self.progress, self.total, self.lo, self.hi = progress, max(1, total), lo, hi
        self.done = 0
        self.started = time.monotonic()

    def step(self, n: int) -> None:
        self.done += n
        elapsed = time.monotonic() - self.started
        left = ""
        if elapsed > 0.5 and self.done:
            seconds = (self.total - self.done) * elapsed / self.done
            left = f", about {seconds:.0f} s left"
        self.progress(
            self.lo + (self.hi - self.lo) * min(1.0, self.done / self.total),
            f"Converting GGUF: {format_bytes(self.done)} of {format_bytes(self.total)}{left}",
        )


ROW_CHUNK_VALUES = 1 << 19  # values de-quantised at a time (2 MB of float32: faster than smaller chunks)


def _float_rows(data, tp: TensorPlan):
    """A tensor de-quantised a few rows at a time straight into its output dtype, rows put where transformers'
    processor would put them (Q/K), so only the output and one chunk's float32 exist at once."""
    # lazy: numpy loads with the engine, not at import
    import numpy as np

    # lazy: torch loads on the engine's thread, never at import
    import torch

    # lazy: gguf_tensors imports numpy (numpy loads with the engine, not at import)
    from . import gguf_tensors as gt

    out = torch.empty(tp.shape, dtype=getattr(torch, tp.out_dtype))
    if len(tp.shape) != 2:
        values = np.array(gt.dequantize(data, tp.qtype), dtype=np.float32).reshape(tp.shape)
        out.copy_(torch.from_numpy(values))
        return out
    rows, cols = tp.shape
    where = None
    if tp.row_heads:
        order = gt.llama_row_permutation(rows, tp.row_heads)  # HF row i is GGUF row order[i]
        where = torch.from_numpy(np.argsort(order))  # GGUF row j goes to HF row where[j]
    step = max(1, ROW_CHUNK_VALUES // max(1, cols))
    raw = np.asarray(data).reshape(rows, -1)
    for r0 in range(0, rows, step):
        chunk = np.array(gt.dequantize(raw[r0 : r0 + step], tp.qtype), dtype=np.float32).reshape(-1, cols)
        values = torch.from_numpy(chunk).to(out.dtype)
        if where is None:
            out[r0 : r0 + len(values)] = values
        else:
            out.index_copy_(0, where[r0 : r0 + len(values)], values)
    return out


def _write_tensors(plan: GGUFPlan, reader, writer: ShardWriter, report: _Progress, should_cancel) -> dict:
    # lazy: numpy loads with the engine, not at import
    import numpy as np

    # lazy: torch loads on the engine's thread, never at import
    import torch

    # lazy: gguf_tensors imports numpy (numpy loads with the engine, not at import)
    from . import gguf_tensors as gt

    by_name = {t.name: t for t in reader.tensors}
    manifest: dict[str, dict] = {}
    parsed: dict[str, Any] = {"tensors": {}}  # processors that merge tensors (MoE experts) write here

    def add_packed(tp: TensorPlan, rt, tied_to: Optional[str] = None) -> None:
        rows, cols = tp.shape
        bw = gt.to_blocks(rt.data, tp.qtype, rows, cols)
        if tp.row_heads:
            bw = gt.permute_rows(bw, gt.llama_row_permutation(rows, tp.row_heads))
        key = f"{tp.packed_module}.weight"
        writer.add(f"{key}.qweight", bw.qweight)
        writer.add(f"{key}.scales", bw.scales)
        if bw.mins is not None:
            writer.add(f"{key}.mins", bw.mins)
        manifest[tp.packed_module] = {
            "bits": bw.bits,
            "mins": bw.mins is not None,
            "in_features": cols,
            "out_features": rows,
            "from": tp.qtype.name,
            "how": tp.how,
        }
        if tied_to:
            manifest[tp.packed_module]["tied_to"] = tied_to

    for tp in plan.tensors:
        check_cancel(should_cancel)
        rt = by_name[tp.gguf_name]
        if tp.packed_module:
            add_packed(tp, rt)
        elif tp.streamed:
            if tp.hf_name:  # tensors transformers has no parameter for (e.g. Llama 3's rope_freqs) are left out
                writer.add(tp.hf_name, _float_rows(rt.data, tp))
        else:
            values = (
                gt.dequantize(rt.data, tp.qtype).reshape(tp.shape) if tp.shape else gt.dequantize(rt.data, tp.qtype)
            )
            result = plan.processor.process(
                weights=values, name=tp.gguf_name, tensor_key_mapping=plan.mapping, parsed_parameters=parsed
            )
            del values
            if result.name is not None and result.name in plan.mapping:
                array = np.ascontiguousarray(result.weights)
                if not array.flags.writeable:  # a view of the read-only mapping (float32 tensors)
                    array = array.copy()
                writer.add(plan.mapping[result.name], torch.from_numpy(array).to(getattr(torch, tp.out_dtype)))
                del array
            del result
        if plan.tied_head is not None and plan.tied_head.gguf_name == tp.gguf_name:
            embed_module = plan.mapping[tp.gguf_name][: -len(".weight")]
            add_packed(plan.tied_head, rt, tied_to=embed_module)
        _release_pages(reader, rt)
        report.step(tp.data_bytes)
    for name, tensor in parsed["tensors"].items():  # merged by the processor across several GGUF tensors
        writer.add(name, tensor.to(getattr(torch, plan.float_dtype)))
    return manifest


def convert_gguf(
    gguf_path: Path,
    dest: Path,
    progress: ProgressFn = noop_progress,
    should_cancel: Optional[CancelFn] = None,
    keep_quantised: bool = True,
    dtype: Optional[str] = None,
) -> Path:
    """Convert ``gguf_path`` into ``dest`` (a temporary folder first, renamed when complete).

    ``keep_quantised``: keep quantised linear weights as Redline blocks (see the module docstring).
    ``dtype``: the float dtype of everything else (None: bf16, or fp16 for an fp16 file).
    """
    gguf_path = Path(gguf_path)
    if is_complete(dest):
        return dest
    if not gguf_path.is_file():
        raise ModelLoadError(f"GGUF file not found: {gguf_path}.", "Check the path.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=dest.parent))
    try:
        progress(0.0, "Reading GGUF metadata")
        reader = open_reader(gguf_path)
        plan = plan_gguf(gguf_path, keep_quantised, dtype, reader=reader)
        check_cancel(should_cancel)
        progress(0.03, "Reading GGUF tokenizer")
        # lazy: transformers loads on the engine's thread, never at import
        from transformers import AutoTokenizer, GenerationConfig

        try:
            with reusing_reader(gguf_path, reader):
                tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        except Exception as exc:
            raise _read_error(gguf_path, exc) from exc
        check_cancel(should_cancel)
        largest = max([t.out_bytes for t in plan.tensors] + [plan.tied_head.out_bytes if plan.tied_head else 0])
        writer = ShardWriter(tmp, max(largest, MIN_SHARD_BYTES))
        report = _Progress(progress, plan.file_bytes, 0.08, 0.97)
        report.step(0)
        try:
            # Each tensor's buffers in mappings of their own, handed back whole when freed, so the process
            # does not keep the pages of every tensor it has converted.
            with weights_in_own_mappings(), returning_freed_memory():
                manifest = _write_tensors(plan, reader, writer, report, should_cancel)
                writer.flush()
        except (RedlineError, Cancelled):
            raise
        except Exception as exc:
            if is_oom(exc):
                raise OutOfMemory(
                    f"Ran out of memory while converting {gguf_path.name}.",
                    "Close other programs and try again; the conversion needs about three times its largest "
                    f"tensor ({format_bytes(3 * largest)}) on top of Redline itself.",
                ) from exc
            raise _read_error(gguf_path, exc) from exc
        progress(0.97, "Writing config and tokenizer")
        writer.close()
        del reader
        config = plan.config
        config.dtype = plan.float_dtype
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(str(tmp))
        GenerationConfig.from_model_config(config).save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        if manifest:
            write_manifest(tmp, manifest, gguf_path.name)
        kept = f", {len(manifest)} layers kept quantised" if manifest else ""
        (tmp / COMPLETE_MARKER).write_text(
            f"converted from {gguf_path.name} (conversion v{CONVERSION_VERSION}, {plan.float_dtype}{kept})\n"
        )
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
        progress(1.0, "Converted")
        return dest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
