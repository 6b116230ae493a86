"""The window's speed gauges follow the speed lab while it runs: each row resets them and names itself, its
live tokens/s and per-token latencies feed them, and its result stays on them until the next row or reply."""

from __future__ import annotations


def follow_speed_lab(window, panel) -> None:
    """Connect a ``SpeedLabPanel``'s signals to ``window.gauges`` (a ``GaugesPanel``)."""
    gauges = window.gauges

    def started(label: str) -> None:
        gauges.start_reply()
        gauges.set_source(f"speed lab: {label}")

    def done(result) -> None:
        if result.status == "ok":
            gauges.finish_reply(
                result.tokens_per_s, result.ttft_ms, int(result.new_tokens or 0), result.p50_ms, result.p95_ms
            )
        gauges.set_source(f"speed lab: {result.config} ({result.status})")

    panel.row_started.connect(started)
    panel.live_speed.connect(gauges.live)
    panel.token_latencies.connect(gauges.add_latencies)
    panel.row_done.connect(done)
