"""Every variant of a hub repository, with the shape its estimate needs, read before anything downloads.

- a safetensors repository: one variant per precision Redline can load it in (the same files; bitsandbytes
  precisions only where bitsandbytes runs); its shape from ``config.json`` alone (a few KB);
- a GGUF repository: one variant per ``.gguf`` file, named by its quant type; its shape from its header and
  tensor table, read by range requests (``gguf_header``), never its weights.

One ``repo_info`` call gives the commit and the files' sizes; everything read for that commit (the variants and
their shapes) is cached in ``<cache>/browse/<repo>@<commit>.<cpu|cuda>.json``, so a second look costs one
request. The device kind is part of the key because the variants depend on it: bitsandbytes precisions on CUDA
only, and no fp16 on a CPU (below).

On a CPU, fp16 is never offered: no CPU kernel of Redline's multiplies fp16 weights, so fp16 runs through
torch's generic path at about an eighth of bf16's speed for the same memory (the starter's F16 GGUF: 9.4 against
81.5 tok/s, docs/models.md). A float16 GGUF loads as bf16 there: each fp16 weight is cast once at load, and the
many F16 files converted from bf16 checkpoints get their original values back exactly.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import ModelSourceError, RedlineError
from ..estimate.estimator import ModelShape, shape_from_config
from ..estimate.fit import precisions_for
from ..estimate.model_shapes import _folder_shape, check_fields
from ..paths import cache_dir
from ..precision import QUANTISED, bitsandbytes_available
from ..sources.gguf import plan_gguf
from ..sources.hub import MODEL_FILES
from .errors import check_online, explain
from .gguf_header import read_header

CACHE_VERSION = 3  # 2: a float GGUF's precision is its float dtype; 3: keyed by the device kind
WEIGHT_FILES = (".safetensors",)
SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# Quant types by the bits per weight they keep (what "best quality" ranks by), from the file name when the
# header's file type says nothing better.
QUANT_NAME = re.compile(r"(?i)(?:^|[-_.])((?:I?Q\d(?:_[A-Z0-9]+)*)|BF16|F16|F32)(?=[-_.]|$)")


@dataclass
class Variant:
    name: str  # "bf16", "q8" (safetensors precisions) or "Q4_K_M" (a GGUF file's quant type)
    precision: str  # what Redline loads it as ("bf16", "q8", … or "gguf")
    files: list[str]  # what a download of it fetches
    download_bytes: int
    quality_bits: float  # bits per weight of its linear layers, for "best quality"
    shape: Optional[dict] = None  # ModelShape.to_dict(); None when it could not be read
    problem: str = ""  # why it could not be read, one sentence
    header_bytes_read: int = 0  # GGUF: what the range reads received

    def model_shape(self) -> Optional[ModelShape]:
        return ModelShape.from_dict(self.shape) if self.shape else None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RepoVariants:
    repo_id: str
    commit: str
    kind: str  # "safetensors" or "gguf"
    gated: bool
    variants: list[Variant] = field(default_factory=list)
    from_cache: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("from_cache")
        return d


BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "q8": 8, "nf4": 4, "fp4": 4, "q4": 4}
GGUF_BITS = {"F32": 32, "F16": 16, "BF16": 16, "Q8_0": 8.5, "Q6_K": 6.6, "Q5_K_M": 5.7, "Q5_K_S": 5.5, "Q5_0": 5.5}
GGUF_BITS.update({"Q5_1": 6, "Q4_K_M": 4.9, "Q4_K_S": 4.6, "Q4_0": 4.5, "Q4_1": 5, "Q3_K_L": 4.3, "Q3_K_M": 3.9})
GGUF_BITS.update({"Q3_K_S": 3.5, "Q2_K": 3.4, "IQ4_XS": 4.3, "IQ4_NL": 4.5})


FLOAT_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _device_kind(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "cpu"


def _cache_file(repo_id: str, commit: str, device: str) -> Path:
    return cache_dir() / "browse" / f"{repo_id.replace('/', '--')}@{commit}.{_device_kind(device)}.json"


def _load_cache(repo_id: str, commit: str, device: str) -> Optional[RepoVariants]:
    path = _cache_file(repo_id, commit, device)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != CACHE_VERSION:
            return None
        rv = RepoVariants(data["repo_id"], data["commit"], data["kind"], data["gated"], from_cache=True)
        rv.variants = [Variant(**v) for v in data["variants"]]
        return rv
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _save_cache(rv: RepoVariants, device: str) -> None:
    path = _cache_file(rv.repo_id, rv.commit, device)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": CACHE_VERSION, **rv.to_dict()}), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # a cache that cannot be written only costs a second read


def quant_name(filename: str) -> str:
    stem = Path(filename).name
    found = QUANT_NAME.findall(stem.removesuffix(".gguf"))
    return found[-1].upper() if found else Path(filename).stem


def _safetensors_precisions(shape: ModelShape, device: str) -> list[str]:

    out = precisions_for(shape)
    if not (device.startswith("cuda") and bitsandbytes_available()):
        out = [p for p in out if p not in QUANTISED]  # bitsandbytes runs on CUDA only
    if _device_kind(device) == "cpu":
        out = [p for p in out if p != "fp16"]  # bf16's memory at an eighth of its speed (the module's docstring)
    return out


def float_gguf_precision(stored_dtype: str, device: str) -> str:
    """What a float GGUF (nothing quantised) loads as on ``device``: its float dtype, but bf16 for fp16 on a CPU."""
    precision = FLOAT_PRECISION.get(stored_dtype, "bf16")
    return "bf16" if precision == "fp16" and _device_kind(device) == "cpu" else precision


def _safetensors_variants(repo_id: str, commit: str, siblings, device: str) -> list[Variant]:

    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import hf_hub_download

    files = {
        s.rfilename: int(s.size or 0) for s in siblings if any(fnmatch.fnmatch(s.rfilename, p) for p in MODEL_FILES)
    }
    weights = sum(size for name, size in files.items() if name.endswith(WEIGHT_FILES))
    try:
        folder = Path(hf_hub_download(repo_id, "config.json", revision=commit)).parent
        shape = _folder_shape(folder, repo_id, weights or None)
    except RedlineError as exc:
        return [Variant("bf16", "bf16", sorted(files), sum(files.values()), 16, problem=str(exc))]
    except Exception as exc:
        raise explain(f"reading the config of {repo_id}", exc) from exc
    total = sum(files.values())
    return [
        Variant(p, p, sorted(files), total, BITS.get(p, 16), shape.to_dict())
        for p in _safetensors_precisions(shape, device)
    ]


def _gguf_shape(path: Path, name: str, file_bytes: int) -> ModelShape:

    plan = plan_gguf(path)  # metadata and the tensor table only: the sparse file's holes are never read
    check_fields(plan.config.to_dict(), name)
    shape = shape_from_config(plan.config, name=name, source=name)
    shape.stored_dtype = plan.float_dtype
    shape.checkpoint_bytes = plan.output_bytes
    shape.file_bytes = file_bytes
    shape.file_types = plan.type_counts()
    shape.packed = [[t.packed_module, t.shape[1], t.shape[0], t.bits, t.mins] for t in plan.packed()]
    return shape


def _gguf_bits(shape: ModelShape, quant: str) -> float:
    if quant in GGUF_BITS:
        return GGUF_BITS[quant]
    if shape.file_bytes and shape.parameters:
        return round(8 * shape.file_bytes / shape.parameters, 1)
    return 0.0


def _gguf_variants(repo_id: str, commit: str, siblings, device: str, should_stop=None) -> list[Variant]:

    out = []
    with tempfile.TemporaryDirectory(prefix="redline-gguf-header-") as tmp:
        for s in sorted(siblings, key=lambda s: s.rfilename):
            name = s.rfilename
            if not name.endswith(".gguf"):
                continue
            shard = SHARD.search(name)
            if shard and shard.group(1) != "00001":
                continue  # the later parts of a split file: the first one stands for it
            size = int(s.size or 0)
            quant = quant_name(SHARD.sub(".gguf", name))
            files = [name]
            if shard:
                prefix = name[: shard.start()]
                files = sorted(x.rfilename for x in siblings if x.rfilename.startswith(prefix + "-"))
                out.append(
                    Variant(
                        quant,
                        "gguf",
                        files,
                        sum(int(x.size or 0) for x in siblings if x.rfilename in files),
                        GGUF_BITS.get(quant, 0.0),
                        problem=f"{name} is split into {int(shard.group(2))} files, which Redline does not load yet.",
                    )
                )
                continue
            if should_stop is not None and should_stop():
                break
            try:
                read = read_header(repo_id, name, commit, size, Path(tmp) / Path(name).name)
                shape = _gguf_shape(read.path, f"{repo_id}/{name}", size)
                bits = _gguf_bits(shape, quant)
                # A float GGUF keeps nothing quantised: it loads at a float precision, not as the file is (gguf).
                precision = "gguf" if shape.packed else float_gguf_precision(shape.stored_dtype, device)
                out.append(Variant(quant, precision, files, size, bits, shape.to_dict(), "", read.bytes_read))
                read.path.unlink()
            except RedlineError as exc:
                out.append(Variant(quant, "gguf", files, size, GGUF_BITS.get(quant, 0.0), problem=str(exc)))
            except Exception as exc:
                raise explain(f"reading the header of {repo_id}/{name}", exc) from exc
    return out


def repo_variants(repo_id: str, device: str = "cpu", use_cache: bool = True) -> RepoVariants:
    """``repo_id``'s variants and their shapes on ``device`` (a target's, "cpu" or "cuda…"), from the cache when this
    commit was read before for that kind of device."""
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import HfApi

    check_online()
    try:
        info = HfApi().repo_info(repo_id, files_metadata=True)
    except Exception as exc:
        raise explain(f"reading {repo_id}", exc) from exc
    commit = info.sha or "unknown"
    if use_cache:
        cached = _load_cache(repo_id, commit, device)
        if cached is not None:
            return cached
    siblings = list(info.siblings or [])
    names = {s.rfilename for s in siblings}
    gated = bool(info.gated) and info.gated != "False"
    if any(n.endswith(".gguf") for n in names):
        rv = RepoVariants(repo_id, commit, "gguf", gated, _gguf_variants(repo_id, commit, siblings, device))
    elif "config.json" in names and any(n.endswith(WEIGHT_FILES) for n in names):
        rv = RepoVariants(
            repo_id, commit, "safetensors", gated, _safetensors_variants(repo_id, commit, siblings, device)
        )
    else:
        raise ModelSourceError(
            f"{repo_id} holds neither .gguf files nor a config.json with .safetensors weights, so Redline cannot "
            "run it.",
            "Choose a GGUF or safetensors repository.",
        )
    if rv.variants and any(v.shape for v in rv.variants):
        _save_cache(rv, device)
    return rv
