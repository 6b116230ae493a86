"""Redline's engine, free of Qt: model sources, loading, decoding, memory, hardware, the speed lab.

This module is the engine's public surface: the window (``redline.ui``) and the application
(``redline.app``) import from here and nowhere deeper (import-linter checks it). Importing it does not
import torch or transformers: they load on the engine's worker thread, when a model loads or a task runs.

Subpackages, each a part of the engine:

- ``sources``: where models come from (folders, hub ids, GGUF files, the starter) and what could run code;
- ``loading``: loading at a precision (transformers, bitsandbytes, Redline's packed int8/int4 layers);
- ``decoding``: the one decode path, the fast decode step, prompts, streaming text, draft pairing;
- ``memory``: measured memory, how the process holds it, and the estimator's predictions;
- ``hardware``: GPUs, RAM, CPU, memory bandwidth, common consumer GPUs;
- ``bench``: the speed lab's configurations, prompt sets, the lab's run loop, batch sweep and exports;
- ``service``: the engine as a service (one scheduler thread owns the model; requests and their events);
- ``server``: the OpenAI-compatible HTTP server over the service, and structured output;
- ``remote``: models behind other OpenAI-compatible servers, used like local ones.
- ``speed``: decode tokens/s and TTFT predicted before loading, learned per machine; the ``auto`` choice by
  priority; speculative-decoding advice.
"""

from redline.inference.bench.configs import BenchConfig, format_config, parse_config, parse_configs
from redline.inference.bench.export import COLUMNS, SWEEP_COLUMNS, to_csv, to_json, to_markdown, to_text
from redline.inference.bench.lab import SEED_PRESET, BenchSpec, run_bench
from redline.inference.bench.prompts import PromptSet, builtin_prompt_sets, load_prompt_set
from redline.inference.bench.results import (
    BenchConcurrencyRow,
    BenchLive,
    BenchPhase,
    BenchReport,
    BenchRow,
    BenchStarted,
    BenchSweepRow,
    BenchToken,
    ConfigResult,
    SweepRow,
)
from redline.inference.bench.saving import list_reports, load_report, save_report
from redline.inference.bench.sets import READY_SETS, configs_text, every_precision, from_presets, ladder
from redline.inference.bench.sweep import MODES as SWEEP_MODES
from redline.inference.browse.fetch import Fetched
from redline.inference.browse.fetch import fetch as fetch_variant
from redline.inference.browse.library import LocalModel, age_text, delete_text, local_library, reclaimable_bytes
from redline.inference.browse.library import delete as delete_local_model
from redline.inference.browse.predict import (
    FITS,
    NO_FIT,
    TIGHT,
    VariantPrediction,
    machine_target,
    predict_repo,
    process_rss,
)
from redline.inference.browse.search import HubModel
from redline.inference.browse.search import search as search_hub
from redline.inference.browse.search import warm_up as warm_up_browser
from redline.inference.browse.variants import RepoVariants, Variant, repo_variants
from redline.inference.decoding.draft_check import check_pair
from redline.inference.decoding.options import STRATEGIES, DecodeOptions, SamplingSettings
from redline.inference.decoding.tool_calls import ToolCall, calls_text, read_calls
from redline.inference.engine import Engine, LoadReport, LoadRequest
from redline.inference.errors import (
    Busy,
    Cancelled,
    ContextExceeded,
    IncompatibleDraft,
    ModelLoadError,
    ModelSourceError,
    NeedsOptIn,
    OutOfMemory,
    RedlineError,
    Refused,
    StarterUnavailable,
    UnsupportedConfiguration,
)
from redline.inference.events import (
    Completed,
    Failed,
    FinishedEvent,
    GenerationResult,
    Notice,
    PrefillProgress,
    Progress,
    Queued,
    Started,
    StatsEvent,
    TokenEvent,
)
from redline.inference.generation.request import GenerationRequest
from redline.inference.hardware.gpus import CONSUMER_GPUS
from redline.inference.hardware.probe import default_device, torch_cuda_build
from redline.inference.hardware.probe import probe as probe_machine
from redline.inference.jobs import (
    KernelsReport,
    KvCacheHeld,
    MachineInfo,
    acceptance_job,
    auto_job,
    describe_job,
    hardware_job,
    kernels_job,
    kv_cache_held,
    machine_job,
    pair_job,
    predictions_job,
    prefix_cache_job,
)
from redline.inference.loading.loader import check_address_space, code_opt_in
from redline.inference.loading.precision import PRECISIONS, PrecisionSpec, parse_precision, resolve_precision
from redline.inference.memory.calibration import correction_bytes, measured_peak_bytes, predict_loaded
from redline.inference.memory.estimator import Estimate, accuracy_margin
from redline.inference.memory.fit import Planner, Target, detect_target, precisions_for, suggest
from redline.inference.memory.measured import snapshot as memory_snapshot
from redline.inference.memory.model_shapes import read_shape
from redline.inference.memory.policy import collector as garbage_collector
from redline.inference.memory.policy import set_collector as set_garbage_collector
from redline.inference.paths import models_dir
from redline.inference.remote.client import RemoteError, display_url, is_server_url, parse_server_spec
from redline.inference.remote.client import list_models as list_server_models
from redline.inference.server.config import DEFAULT_HOST, DEFAULT_PORT, ServerConfig, ServerConfigError, is_loopback
from redline.inference.server.lifetime import ApiServer
from redline.inference.service.requests import RequestHandle
from redline.inference.service.scheduler import EngineService
from redline.inference.sources.describe import describe as describe_model
from redline.inference.sources.gguf import is_complete as is_converted
from redline.inference.sources.resolve import ACCEPTED_FORMS
from redline.inference.sources.resolve import resolve as resolve_model
from redline.inference.sources.starter import STARTER_NAME, legacy_starter_folder, starter_folder
from redline.inference.speed.arithmetic import Machine, SpeedPrediction, cached_machine, card_machine, this_machine
from redline.inference.speed.calibration import SpeedCalibration
from redline.inference.speed.choose import (
    DEFAULT_PRIORITY,
    PRIORITIES,
    PRIORITY_LABELS,
    AutoChoice,
    check_priority,
    choose,
    resolve_auto,
)
from redline.inference.speed.model import SpeedModel
from redline.inference.speed.speculative import AcceptanceMeasurement, DraftAdvice, advise, measure_acceptance
from redline.inference.units import GB, MB, format_bytes

__all__ = [
    "age_text",
    "delete_local_model",
    "delete_text",
    "Fetched",
    "fetch_variant",
    "FITS",
    "HubModel",
    "local_library",
    "LocalModel",
    "machine_target",
    "NO_FIT",
    "predict_repo",
    "process_rss",
    "reclaimable_bytes",
    "repo_variants",
    "RepoVariants",
    "search_hub",
    "TIGHT",
    "Variant",
    "VariantPrediction",
    "warm_up_browser",
    "acceptance_job",
    "auto_job",
    "describe_job",
    "hardware_job",
    "kernels_job",
    "KvCacheHeld",
    "kv_cache_held",
    "prefix_cache_job",
    "KernelsReport",
    "machine_job",
    "MachineInfo",
    "pair_job",
    "predictions_job",
    "AcceptanceMeasurement",
    "BenchConcurrencyRow",
    "ACCEPTED_FORMS",
    "accuracy_margin",
    "advise",
    "AutoChoice",
    "BenchConfig",
    "BenchLive",
    "BenchPhase",
    "BenchReport",
    "BenchRow",
    "BenchSpec",
    "BenchStarted",
    "BenchSweepRow",
    "BenchToken",
    "builtin_prompt_sets",
    "cached_machine",
    "Cancelled",
    "card_machine",
    "check_pair",
    "check_priority",
    "choose",
    "COLUMNS",
    "ConfigResult",
    "configs_text",
    "CONSUMER_GPUS",
    "correction_bytes",
    "DecodeOptions",
    "default_device",
    "DEFAULT_PRIORITY",
    "describe_model",
    "detect_target",
    "DraftAdvice",
    "Engine",
    "LoadReport",
    "LoadRequest",
    "ContextExceeded",
    "Estimate",
    "every_precision",
    "FinishedEvent",
    "format_bytes",
    "format_config",
    "from_presets",
    "garbage_collector",
    "GB",
    "GenerationResult",
    "Notice",
    "IncompatibleDraft",
    "is_converted",
    "legacy_starter_folder",
    "ladder",
    "list_reports",
    "load_prompt_set",
    "load_report",
    "Machine",
    "MB",
    "measure_acceptance",
    "measured_peak_bytes",
    "memory_snapshot",
    "ModelLoadError",
    "models_dir",
    "ModelSourceError",
    "NeedsOptIn",
    "check_address_space",
    "code_opt_in",
    "OutOfMemory",
    "parse_config",
    "parse_configs",
    "parse_precision",
    "Planner",
    "PRECISIONS",
    "PrecisionSpec",
    "precisions_for",
    "predict_loaded",
    "PRIORITIES",
    "PRIORITY_LABELS",
    "probe_machine",
    "PromptSet",
    "read_shape",
    "READY_SETS",
    "RedlineError",
    "resolve_auto",
    "resolve_model",
    "resolve_precision",
    "run_bench",
    "SamplingSettings",
    "save_report",
    "SEED_PRESET",
    "set_garbage_collector",
    "SpeedCalibration",
    "SpeedModel",
    "SpeedPrediction",
    "starter_folder",
    "STARTER_NAME",
    "StarterUnavailable",
    "StatsEvent",
    "STRATEGIES",
    "suggest",
    "SWEEP_COLUMNS",
    "SWEEP_MODES",
    "SweepRow",
    "Target",
    "this_machine",
    "to_csv",
    "to_json",
    "to_markdown",
    "to_text",
    "TokenEvent",
    "torch_cuda_build",
    "UnsupportedConfiguration",
    "Busy",
    "Completed",
    "Failed",
    "GenerationRequest",
    "PrefillProgress",
    "Progress",
    "Queued",
    "Refused",
    "RequestHandle",
    "Started",
    "EngineService",
    "ApiServer",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "is_loopback",
    "ServerConfig",
    "ServerConfigError",
    "display_url",
    "is_server_url",
    "list_server_models",
    "parse_server_spec",
    "RemoteError",
    "ToolCall",
    "calls_text",
    "read_calls",
]
