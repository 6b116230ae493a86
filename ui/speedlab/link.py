"""The window's speed gauges follow the speed lab while it runs: each row resets them and names itself, its
live tokens/s and per-token latencies feed them, and its result stays on them until the next row or reply."""

from __future__ import annotations


def follow_speed_lab(window, panel) -> None:
    """Connect a ``SpeedLabPanel``'s signals to ``window.gauges`` (a ``GaugesPanel``). Each figure the lab sends
    names its row, so the label under the gauge is always that of the figures shown (a chat's reply names itself
    as the chat the same way)."""
    gauges = window.gauges
    row = {"label": ""}

    def started(label: str) -> None:
        row["label"] = f"speed lab: {label}"
        gauges.start_reply()
        gauges.set_source(row["label"])

    def live(tokens_per_s: float, ttft_ms, new_tokens: int) -> None:
        gauges.live(tokens_per_s, ttft_ms, new_tokens, source=row["label"])

    def done(result) -> None:
        if result.status == "ok":
            gauges.finish_reply(
                result.tokens_per_s, result.ttft_ms, int(result.new_tokens or 0), result.p50_ms, result.p95_ms
            )
        gauges.set_source(f"speed lab: {result.config} ({result.status})")

    panel.row_started.connect(started)
    panel.live_speed.connect(live)
    panel.token_latencies.connect(gauges.add_latencies)
    panel.row_done.connect(done)
