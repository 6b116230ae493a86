"""Jobs for the engine's thread: what the window, the wizard and the speed lab ask the engine service to run
beside generations and loads (torch, transformers and tokenizers load there, never on the UI thread).

Each function returns a job ``fn(engine, report)`` for ``EngineService.call``: resolving ``auto``, this machine's
hardware and measured figures, predictions for speed-lab rows, a model's description, whether a draft pairs with
its target, a draft's acceptance run, and whether Redline's CPU kernels run here (with what they are worth).
Loading and unloading are the service's own requests (``EngineService.load`` and ``unload``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .backends.base import KvCacheHeld
from .cost import KV_FORMS
from .decoding.draft_check import check_pair
from .errors import RedlineError
from .estimate.calibration import correction_bytes
from .estimate.describe import describe
from .estimate.fit import detect_target
from .estimate.model_shapes import read_shape
from .hardware.probe import probe
from .kernels.cpu import library as native
from .speed.arithmetic import this_machine
from .speed.choose import resolve_auto
from .speed.model import SpeedModel
from .speed.speculative import measure_acceptance


def _reclaimable(engine) -> int:
    """What the model loaded now gives back when it is replaced."""
    return sum(m.memory_bytes or 0 for m in (engine.target, engine.draft) if m is not None)


def auto_job(model: str, precision: str, strategy: str, priority: str, context: Optional[int], kv: str = "bf16"):
    """``auto`` for the model about to load (``redline.inference.resolve_auto``, as ``redline chat`` does):
    the model loaded now counts as free memory, since it is replaced. ``kv``: the KV cache's form set."""

    def job(engine, report):

        return resolve_auto(model, engine.device, precision, strategy, priority, context, _reclaimable(engine), kv=kv)

    return job


def machine_job():
    """This machine's measured bandwidth and FLOP/s (measured once, then cached): a ``Machine``."""

    def job(engine, report):

        return this_machine(engine.device)

    return job


def predictions_job(model: str, configs: list, prompt_tokens: int, new_tokens: int):
    """The speed model's prediction for each speed-lab row (the reason instead where it cannot predict one)."""

    def job(engine, report):

        speed = SpeedModel(this_machine(engine.device))
        try:
            shape = read_shape(model)
        except RedlineError as exc:
            return [str(exc)] * len(configs)
        drafts: dict = {}
        out: list = []
        for c in configs:
            if getattr(c, "strategy", None) == "remote":
                out.append("The server's speed is its own: the speed model predicts only what runs here.")
                continue
            try:
                draft = None
                if c.strategy == "speculative" and c.draft:
                    if c.draft not in drafts:
                        drafts[c.draft] = read_shape(c.draft)
                    draft = drafts[c.draft]
                out.append(speed.predict_config(shape, c, prompt_tokens, new_tokens, draft))
            except RedlineError as exc:
                out.append(str(exc))
        return out

    return job


def acceptance_job(target: str, target_precision: str, draft: str, draft_precision: str, k: int):
    """A few dozen tokens through the real speculative strategy: how many draft tokens the target accepts."""

    def job(engine, report):

        return measure_acceptance(
            engine,
            target,
            target_precision,
            draft,
            draft_precision,
            k,
            should_cancel=getattr(report, "cancelled", None),
        )

    return job


def describe_job(spec: str):
    """Validate a model choice and read its shape without its weights (the wizard's first page)."""

    def job(engine, report):

        return describe(spec)

    return job


@dataclass
class MachineInfo:
    """The wizard's hardware page: what this machine has, and the memory to plan with."""

    hardware: Any  # hardware.probe.HardwareInfo
    target: Any  # memory.fit.Target: the memory to plan with on this machine
    correction_bytes: int  # the estimator's correction learned on this machine
    reclaimable_bytes: int  # what the model loaded now gives back when replaced
    device: str


def hardware_job():
    def job(engine, report):

        reclaimable = _reclaimable(engine)
        target = detect_target(reclaimable_bytes=reclaimable, device=engine.device)
        correction = correction_bytes(target.device, key=target.calibration_key) if target.calibration_key else 0
        return MachineInfo(probe(), target, correction, reclaimable, engine.device)

    return job


def pair_job(target_spec: str, draft_spec: str):
    """Whether the draft pairs with the target, from configs and tokenizers (``decoding.draft_check``)."""

    def job(engine, report):

        return check_pair(target_spec, draft_spec)

    return job


# -- Redline's CPU kernels: do they run here, and what are they worth ------------------------------------------
KERNEL_PRECISIONS = ("q8", "q4", "bf16")  # what the kernels speed up on a CPU, in the order a user meets them


@dataclass
class KernelsReport:
    """Whether Redline's native CPU kernels run here and, when they do not, why, what it costs and the fix.

    ``with_tokens_per_s`` / ``without_tokens_per_s``: the speed model's decode tokens/s for the model loaded (or the
    starter) on the fast path with the kernels and on torch's operators, at ``precision``; None where it cannot
    predict (the reason is in ``cost``)."""

    on: bool
    text: str  # one sentence for people
    why: Optional[str] = None
    fix: Optional[str] = None
    device: str = "cpu"
    model: Optional[str] = None
    precision: Optional[str] = None
    with_tokens_per_s: Optional[float] = None
    without_tokens_per_s: Optional[float] = None
    cost: str = ""  # "≈ 12.0 tok/s instead of ≈ 41.0 (fast · q8, SmolLM2-135M-Instruct, …)", or why unknown
    details: dict = field(default_factory=dict)  # kernels.cpu.library.status()

    def sentence(self) -> str:
        """What the status bar, Help → About, ``redline bench`` and ``redline estimate`` say when the kernels
        cannot run (empty when they can): why, what it costs, how to fix it. The one place these words are made."""
        if self.on:
            return ""
        return f"Redline's CPU kernels cannot run here: {self.clause()}."

    def clause(self) -> str:
        """The same account as a clause, for a line that already names the kernels (``redline bench``'s machine
        line: "Redline's CPU kernels off: …"); "on" when they run."""
        if self.on:
            return "on"
        parts = [self.why or "unknown"]
        if self.cost:
            parts.append(f"cost: {self.cost}")
        if self.fix:
            parts.append(f"fix: {self.fix}")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("on", "why", "fix", "device", "model", "precision", "cost")}
        d.update(with_tokens_per_s=self.with_tokens_per_s, without_tokens_per_s=self.without_tokens_per_s)
        d["sentence"] = self.sentence()
        return d

    @classmethod
    def here(
        cls,
        device: str = "cpu",
        model: Optional[str] = None,
        precision: Optional[str] = None,
        machine=None,
        shape=None,
    ) -> "KernelsReport":
        """Whether Redline's CPU kernels run on ``device`` here (``kernels.cpu.library.summary``: builds nothing) and,
        when they do not, the speed model's prediction with and without them for ``shape`` (or ``model``, default
        the starter) at ``precision`` (default q8, the weights the kernels help most). ``machine``: the speed
        model's figures for this machine when the caller has them (else measured once, cached)."""

        info = _kernel_summary()
        rep = cls(
            on=bool(info.get("on")),
            text=str(info.get("text", "")),
            why=info.get("why"),
            fix=info.get("fix"),
            device=device,
        )
        if device.startswith("cuda"):  # the kernels are the CPU's; a GPU runs its own
            rep.on, rep.why, rep.fix = True, None, None
            return rep
        if rep.on:
            return rep
        try:
            rep.details = dict(native.status())
        except Exception:  # a report only
            rep.details = {}
        rep.model, rep.precision = model or "starter", precision or "q8"
        try:
            # lazy: it may be missing or fail to load here, which the handler below says
            from .estimate.model_shapes import read_shape

            # lazy: it may be missing or fail to load here, which the handler below says
            from .speed.arithmetic import this_machine

            # lazy: it may be missing or fail to load here, which the handler below says
            from .speed.model import SpeedModel

            speed = SpeedModel(machine or this_machine(device))
            shape = shape or read_shape(rep.model)
            rep.model = shape.name
            with_ = speed.predict(shape, rep.precision, "fast", 64, 128, kernels=True)
            without = speed.predict(shape, rep.precision, "fast", 64, 128, kernels=False)
            rep.with_tokens_per_s, rep.without_tokens_per_s = with_.tokens_per_s, without.tokens_per_s
            rep.cost = (
                f"≈ {without.tokens_per_s:.1f} tok/s instead of ≈ {with_.tokens_per_s:.1f} "
                f"(fast · {rep.precision}, {shape.name}, predicted by the speed model)"
            )
        except (RedlineError, OSError, ValueError) as exc:
            rep.cost = f"not predicted ({exc})"
        return rep


def _kernel_summary() -> dict:

    summary = getattr(native, "summary", None)
    if summary is not None:
        return dict(summary())
    why = native.will_run()  # older kernels module: no summary() yet
    if why is None:
        return {"on": True, "text": "Redline's CPU kernels on"}
    return {"on": False, "why": why, "fix": None, "text": f"Redline's CPU kernels off: {why}"}


def kernels_job(model: Optional[str] = None, precision: Optional[str] = None):
    """``KernelsReport.here`` on the engine's thread (it may import torch) for the engine's device and ``model``
    (default: the model loaded, else the starter)."""

    def job(engine, report):
        device = engine.device or "cpu"
        target = engine.target
        spec = model or (target.reload_spec()[0] if target is not None and target.capabilities.token_ids else "starter")
        rep = KernelsReport.here(device, spec, precision)
        if not rep.on and target is not None:
            rep.model = target.name
        return rep

    return job


def kv_cache_held(engine) -> Optional[KvCacheHeld]:
    """The prefix cache of the model loaded, read without the engine's thread (a few integers; a gauge's reading),
    or None where there is none: no model, a server's model, or a model whose replies do not take the fast path
    (its cache is made at the load where ``auto`` runs the fast path, else at the first fast reply)."""
    target = engine.target if engine is not None else None
    return target.cached_kv() if target is not None else None


def kv_form_job(form: str):
    """Keep the fast path's KV cache as ``form`` ("bf16" or "q8": ``cost.KV_FORMS``) from the next load on (the
    engine's batch limits; a model loaded keeps its cache's form until it is loaded again). Its value: the form."""
    if form not in KV_FORMS:
        raise ValueError(f"the KV cache is kept as {' or '.join(KV_FORMS)}, not {form!r}")

    def job(engine, report):
        engine.limits.kv = form
        return form

    return job


def prefix_cache_job(nbytes: int):
    """Set what the prefix cache may keep (bytes; 0 turns it off): for the next load (the engine's batch limits)
    and at once for the model loaded, whose cached pages beyond it are let go."""
    if nbytes < 0:
        raise ValueError("the prefix cache's size cannot be negative")

    def job(engine, report):
        engine.limits.prefix_cache_bytes = int(nbytes)  # for the next load
        if engine.target is not None:
            engine.target.set_prefix_cache(int(nbytes))
        return kv_cache_held(engine)

    return job
