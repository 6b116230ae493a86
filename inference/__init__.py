"""Redline's engine, free of Qt: model sources, loading, decoding, memory, hardware, the speed lab.

This module is the engine's public surface: the window (``redline.ui``) and the application
(``redline.app``) import from here and nowhere deeper (import-linter checks it). Importing it does not
import torch or transformers: they load on the engine's worker thread, when a model loads or a task runs.

Subpackages, each a part of the engine:

- ``attachments``: documents and images attached to a message, read to text or checked, and placed in a prompt;
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
  priority; speculative-decoding advice;
- ``tools``: MCP servers (``mcp.json``), built-in tools, the approval of each call and the tool loop.
"""

from .attachment_cost import AttachmentCost, attachment_cost_job
from .attachments import AttachmentError, Document, Image, Page
from .attachments.read import ACCEPTED as ATTACHMENT_KINDS
from .attachments.read import FILE_FILTER as ATTACHMENT_FILTER
from .attachments.read import read_attachment
from .attachments.read import read_bytes as read_attachment_bytes
from .backends.remote import RemoteError, display_url, is_server_url, parse_server_spec
from .backends.remote import list_models as list_server_models
from .bench.configs import BenchConfig, format_config, parse_config, parse_configs
from .bench.export import (
    COLUMNS,
    REASONING_COLUMNS,
    SWEEP_COLUMNS,
    hidden_columns,
    to_csv,
    to_json,
    to_markdown,
    to_text,
)
from .bench.lab import SEED_PRESET, BenchSpec, run_bench
from .bench.prompts import PromptSet, builtin_prompt_sets, load_prompt_set
from .bench.results import (
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
from .bench.saving import list_reports, load_report, save_report
from .bench.sets import READY_SETS, configs_text, every_precision, for_model, from_presets, kv_forms, ladder
from .bench.sweep import MODES as SWEEP_MODES
from .browse.fetch import Fetched
from .browse.fetch import fetch as fetch_variant
from .browse.library import LocalModel, age_text, delete_text, local_library, reclaimable_bytes
from .browse.library import delete as delete_local_model
from .browse.predict import (
    FITS,
    NO_FIT,
    TIGHT,
    VariantPrediction,
    machine_target,
    predict_repo,
    process_rss,
)
from .browse.search import HubModel
from .browse.search import search as search_hub
from .browse.search import warm_up as warm_up_browser
from .browse.variants import RepoVariants, Variant, repo_variants
from .cost import KV_FORMS
from .decoding.draft_check import check_pair
from .decoding.options import STRATEGIES, DecodeOptions, SamplingSettings
from .decoding.tool_calls import ToolCall, calls_text, read_calls
from .engine import Engine, LoadReport, LoadRequest
from .errors import (
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
from .estimate.calibration import correction_bytes, measured_peak_bytes, predict_loaded
from .estimate.describe import describe as describe_model
from .estimate.estimator import Estimate, accuracy_margin
from .estimate.fit import Planner, Target, detect_target, precisions_for, suggest
from .estimate.model_shapes import read_shape
from .events import (
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
from .generation.request import GenerationRequest
from .hardware.gpus import CONSUMER_GPUS
from .hardware.probe import default_device, torch_cuda_build
from .hardware.probe import probe as probe_machine
from .jobs import (
    KernelsReport,
    KvCacheHeld,
    MachineInfo,
    acceptance_job,
    auto_job,
    describe_job,
    hardware_job,
    kernels_job,
    kv_cache_held,
    kv_form_job,
    machine_job,
    pair_job,
    predictions_job,
    prefix_cache_job,
)
from .loading.loader import check_address_space
from .memory.measured import snapshot as memory_snapshot
from .memory.policy import collector as garbage_collector
from .memory.policy import set_collector as set_garbage_collector
from .paths import models_dir
from .precision import AS_FILE, PRECISIONS, PrecisionSpec, parse_precision, resolve_precision
from .reasoning import EFFORTS as REASONING_EFFORTS
from .reasoning import Thinking
from .server.config import DEFAULT_HOST, DEFAULT_PORT, ServerConfig, ServerConfigError, is_loopback
from .server.lifetime import ApiServer
from .service.requests import RequestHandle
from .service.scheduler import EngineService
from .sources.config import code_opt_in
from .sources.gguf import is_complete as is_converted
from .sources.resolve import ACCEPTED_FORMS
from .sources.resolve import resolve as resolve_model
from .sources.starter import STARTER_NAME, legacy_starter_folder, starter_folder
from .speed.arithmetic import Machine, SpeedPrediction, cached_machine, card_machine, this_machine
from .speed.calibration import SpeedCalibration
from .speed.choose import (
    DEFAULT_CONTEXT_CAP,
    DEFAULT_PRIORITY,
    PRIORITIES,
    PRIORITY_LABELS,
    AutoChoice,
    Candidate,
    check_priority,
    choose,
    fastest_that_fits,
    rank_strategies,
    resolve_auto,
)
from .speed.model import CHAT_NEW_TOKENS, CHAT_PROMPT_TOKENS, NEXT_TURN_TOKENS, SpeedModel
from .speed.speculative import AcceptanceMeasurement, DraftAdvice, advise, measure_acceptance
from .stats import decode_tokens_per_s, percentile, token_latencies_ms
from .tools import (
    ApprovalPolicy,
    BuiltinTools,
    CallRecord,
    LoopResult,
    McpConfigError,
    McpManager,
    McpServerError,
    McpTool,
    PendingCall,
    ServerSpec,
    ServiceGenerator,
    ToolEntry,
    ToolRegistry,
    ToolResult,
    parse_mcp_config,
    read_mcp_config,
    run_tool_loop,
    tool_tokens_job,
)
from .units import GB, MB, format_bytes

__all__ = [
    "Page",
    "AttachmentCost",
    "attachment_cost_job",
    "ATTACHMENT_FILTER",
    "ATTACHMENT_KINDS",
    "AttachmentError",
    "Document",
    "Image",
    "read_attachment",
    "read_attachment_bytes",
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
    "kv_form_job",
    "KV_FORMS",
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
    "Candidate",
    "fastest_that_fits",
    "rank_strategies",
    "DEFAULT_CONTEXT_CAP",
    "CHAT_NEW_TOKENS",
    "CHAT_PROMPT_TOKENS",
    "NEXT_TURN_TOKENS",
    "decode_tokens_per_s",
    "percentile",
    "token_latencies_ms",
    "AS_FILE",
    "COLUMNS",
    "REASONING_COLUMNS",
    "hidden_columns",
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
    "for_model",
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
    "kv_forms",
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
    "REASONING_EFFORTS",
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
    "Thinking",
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
    "ApprovalPolicy",
    "BuiltinTools",
    "CallRecord",
    "LoopResult",
    "McpConfigError",
    "McpManager",
    "McpServerError",
    "McpTool",
    "PendingCall",
    "ServerSpec",
    "ServiceGenerator",
    "ToolEntry",
    "ToolRegistry",
    "ToolResult",
    "parse_mcp_config",
    "read_mcp_config",
    "run_tool_loop",
    "tool_tokens_job",
]
