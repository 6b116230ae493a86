"""Every strategy × {fp32, int8, nf4} loads and generates on the CPU for real (bitsandbytes included)."""

import pytest

from redline.inference.decoding.options import STRATEGIES, DecodeOptions, SamplingSettings
from redline.inference.engine import Engine
from redline.inference.precision import parse_precision

GREEDY = SamplingSettings(max_new_tokens=12, temperature=0)
PROMPT = [{"role": "user", "content": "Local models run on consumer GPUs with int8 and nf4 quantisation."}]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8", "nf4", "fp4+keep=lm_head"])
def test_every_strategy_runs_at_precision(precision, tiny_model_dir, tiny_draft_dir):
    eng = Engine(device="cpu")
    loaded = eng.load(str(tiny_model_dir), parse_precision(precision))
    if precision.startswith(("int8", "nf4", "fp4")):
        import bitsandbytes as bnb

        linear = loaded.model.model.layers[0].mlp.up_proj
        assert isinstance(linear, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit))
        assert type(loaded.model.lm_head).__name__ == "Linear"  # never quantised
    eng.load_draft(str(tiny_draft_dir), parse_precision("int8" if precision != "fp32" else "fp32"))
    outputs = {}
    for strategy in STRATEGIES:
        result = eng.chat(PROMPT, GREEDY, DecodeOptions(strategy))
        assert result.finish_reason == "length", (strategy, result.error)
        assert result.new_tokens == 12
        outputs[strategy] = result.token_ids
    if precision == "fp32":
        assert len({tuple(v) for v in outputs.values()}) == 1
