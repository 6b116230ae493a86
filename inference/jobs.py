"""Jobs for the engine's thread: what the window, the wizard and the speed lab ask it about speed (torch loads there):
resolving ``auto``, this machine's measured figures, predictions for lab rows, a draft's acceptance run.

Each function returns a task ``fn(engine, report)`` for ``EngineClient.run`` / ``EngineThread.submit``."""

from __future__ import annotations

from typing import Optional


def auto_task(model: str, precision: str, strategy: str, priority: str, context: Optional[int]):
    """``auto`` for the model about to load (``redline.inference.resolve_auto``, as ``redline chat`` does):
    the model loaded now counts as free memory, since it is replaced."""

    def task(engine, report):
        from redline.inference import resolve_auto

        reclaimable = sum(m.memory_bytes for m in (engine.target, engine.draft) if m is not None)
        return resolve_auto(model, engine.device, precision, strategy, priority, context, reclaimable)

    return task


def machine_task():
    """This machine's measured bandwidth and FLOP/s (measured once, then cached): a ``Machine``."""

    def task(engine, report):
        from redline.inference import this_machine

        return this_machine(engine.device)

    return task


def predictions_task(model: str, configs: list, prompt_tokens: int, new_tokens: int):
    """The speed model's prediction for each speed-lab row (None where it cannot predict one, with why)."""

    def task(engine, report):
        from redline.inference import RedlineError, SpeedModel, read_shape, this_machine

        speed = SpeedModel(this_machine(engine.device))
        shape = read_shape(model)
        drafts: dict = {}
        out = []
        for c in configs:
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

    return task


def acceptance_task(target: str, target_precision: str, draft: str, draft_precision: str, k: int):
    """A few dozen tokens through the real speculative strategy: how many draft tokens the target accepts."""

    def task(engine, report):
        from redline.inference import measure_acceptance

        return measure_acceptance(
            engine,
            target,
            target_precision,
            draft,
            draft_precision,
            k,
            should_cancel=getattr(report, "cancelled", None),
        )

    return task
