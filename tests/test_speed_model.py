"""The speed model: bytes and FLOPs per token per precision, growth with context, the strategies' arithmetic,
the per-machine calibration (learned, persisted, bounded), speculative advice, and the ``auto`` choice."""

from __future__ import annotations

import dataclasses
import json

import pytest

from redline.inference.cost import kv_read_bytes, step_flops, weights_bytes, weights_read_bytes
from redline.inference.estimate.fit import Planner, Target
from redline.inference.estimate.model_shapes import shipped_starter_shape
from redline.inference.precision import parse_precision
from redline.inference.speed import calibration as cal_mod
from redline.inference.speed.arithmetic import (
    Machine,
    break_even_acceptance,
    predict,
    speculative_speedup,
    token_acceptance,
    tokens_per_step,
)
from redline.inference.speed.calibration import MAX_FACTOR, MIN_FACTOR, SpeedCalibration
from redline.inference.speed.choose import choose
from redline.inference.speed.model import SpeedModel
from redline.inference.speed.speculative import advise
from redline.inference.units import GB

STARTER = shipped_starter_shape()
CPU = Machine("cpu", 20e9, 100e9, "a test CPU", "cpu")
V, H = 49152, 576  # the starter's vocabulary and hidden size


def linears_without_head(shape):
    return sum(i * o for n, i, o, _b in shape.linears if n not in shape.tied_linears)


# --------------------------------------------------------------------------- bytes per token
def test_float_bytes_per_token_read_every_weight_once():
    # Tied embeddings: the output head reads the whole table, so every parameter is read once.
    assert weights_read_bytes(STARTER, parse_precision("fp32")) == STARTER.parameters * 4
    assert weights_read_bytes(STARTER, parse_precision("bf16")) == STARTER.parameters * 2
    # Untied: the embedding table costs one row per token, the separate head is read whole.
    untied = shipped_starter_shape()
    untied.tied_linears = []
    untied.parameters += V * H
    assert weights_read_bytes(untied, parse_precision("bf16")) == (untied.parameters - V * H) * 2 + H * 2


def test_q8_q4_bytes_are_gguf_blocks_on_a_cpu():
    body = linears_without_head(STARTER)
    head = V * H  # a tied head gets its own packed copy
    norms = STARTER.parameters - body - V * H
    n = body + head
    q8 = weights_read_bytes(STARTER, parse_precision("q8"))
    q4 = weights_read_bytes(STARTER, parse_precision("q4"))
    assert q8 == n + n // 32 * 2 + (norms + 1 * H) * 2  # 1 + 2/32 bytes per weight, norms in bf16
    assert q4 == n // 2 + n // 32 * 4 + (norms + 1 * H) * 2  # 0.5 + 4/32 bytes per weight
    assert q8 / n == pytest.approx(1 + 2 / 32, rel=0.01) and q4 / n == pytest.approx(0.5 + 4 / 32, rel=0.01)
    # The same bytes the memory estimator counts, less the embedding table (one row read per token).
    for p in ("q8", "q4"):
        wb = weights_bytes(STARTER, parse_precision(p), "cpu")
        assert weights_read_bytes(STARTER, parse_precision(p)) == wb.total - V * H * 2 + H * 2


def test_a_gguf_as_the_file_is_predicted_and_learned_with_the_kernels_that_run_it():
    """A Q8_0 GGUF runs on the q8 block kernels, a Q4_0 one on the q4 ones: their rates and their calibration
    class follow (both were the 4-bit ones' before, whatever the file held)."""
    from redline.inference.speed.arithmetic import class_key, gguf_kernels

    q8_file, q4_file, gguf = as_gguf(STARTER, 8), as_gguf(STARTER, 4), parse_precision("gguf")
    assert gguf_kernels(q8_file) == "q8" and gguf_kernels(q4_file) == "q4" and gguf_kernels(STARTER) == "q4"
    assert class_key("fast", gguf, q8_file) == "fast:q8" and class_key("fast", gguf, q4_file) == "fast:q4"
    assert class_key("fast", gguf) == "fast:gguf"  # no shape: nothing to tell the kernels by
    p8, p4 = predict(q8_file, gguf, "fast", CPU), predict(q4_file, gguf, "fast", CPU)
    assert p8.class_key == "fast:q8" and p4.class_key == "fast:q4"


def as_gguf(shape, bits, head_bits=None, mins=False):
    """The shape as a GGUF file's: every layer at ``bits`` (the head at ``head_bits``); ``mins``: Q4_1 blocks."""
    linears = [
        [name, fan_in, fan_out, head_bits if (head_bits and name == "lm_head") else bits, mins]
        for name, fan_in, fan_out, *_ in shape.linears
    ]
    return dataclasses.replace(shape, packed=linears)


def scaled(shape, layers_factor=1, width_factor=1):
    """A shape with more layers and wider matrices (the 1B-shaped model is about 8x the starter's weights)."""
    w = width_factor
    linears = [[n, i * w, o * w, b] for n, i, o, b in shape.linears]
    return dataclasses.replace(shape, linears=linears, layers=shape.layers * layers_factor, hidden=shape.hidden * w)


def test_four_bit_decode_is_its_arithmetic_so_its_time_follows_the_weights_not_the_bytes():
    """The 4-bit kernels are bound by their arithmetic: a Q4_0 file (fewer bytes than q4's Q4_1 blocks) is no
    faster, and a step's time grows with the weights, so a factor learned on a small model carries to a larger
    one. With the byte count and a per-layer overhead, the starter's q4 was predicted 2.5x too slow and a 1B
    model 38 % too fast after calibrating on it."""
    from redline.inference.speed.arithmetic import product_classes

    cpu = Machine("cpu", 40e9, 100e9, "a CPU with the bandwidth of a desktop's two channels", "cpu")
    gguf, q4 = parse_precision("gguf"), parse_precision("q4")
    q4_file, q4_1_file = as_gguf(STARTER, 4), as_gguf(STARTER, 4, mins=True)
    assert product_classes(q4_file, gguf)["q4"][:2] == product_classes(STARTER, q4)["q4"][:2]
    assert product_classes(q4_file, gguf)["q4"][0] > 0
    p_file, p_file_1 = (predict(f, gguf, "fast", cpu, kernels=True) for f in (q4_file, q4_1_file))
    assert p_file.weights_read_bytes < p_file_1.weights_read_bytes  # Q4_0 has no mins
    assert p_file.bound == p_file_1.bound == "compute"
    assert p_file.uncorrected_tokens_per_s == pytest.approx(p_file_1.uncorrected_tokens_per_s, rel=0.01)
    step = 1 / predict(STARTER, q4, "fast", cpu, kernels=True).uncorrected_tokens_per_s
    # 4x the layers, twice the width: 16x the weights of each layer's products; the step grows close to that.
    big = scaled(STARTER, 4, 2)
    ratio = (1 / predict(big, q4, "fast", cpu, kernels=True).uncorrected_tokens_per_s) / step
    weights = product_classes(big, q4)["q4"][0] / product_classes(STARTER, q4)["q4"][0]
    assert 0.85 * weights < ratio <= weights
    # Where the kernels do not run, torch's operators are predicted by their bytes, as before.
    assert predict(STARTER, q4, "fast", cpu, kernels=False).bound == "memory"


def test_each_weight_class_of_a_mixed_file_costs_its_own_rate():
    """A GGUF's layers run on the kernels of their own types: an 8-bit head beside 4-bit layers streams at the
    8-bit rate, a float head (a file whose table is F16) at the dense one; the starter's Q4_0 file with its F16
    table was predicted as if the head were 4-bit (+35 %, docs/models.md)."""
    from redline.inference.speed.arithmetic import product_classes

    cpu = Machine("cpu", 25e9, 120e9, "a 2-core CPU", "cpu")
    gguf = parse_precision("gguf")
    head = next(i * o for n, i, o, _b in STARTER.linears if n == "lm_head")
    all4, head8 = as_gguf(STARTER, 4), as_gguf(STARTER, 4, head_bits=8)
    float_head = dataclasses.replace(all4, packed=[p for p in all4.packed if p[0] != "lm_head"])
    assert product_classes(head8, gguf)["q8"][0] == head
    assert product_classes(float_head, gguf)["dense"][0] == head
    tps = [predict(s, gguf, "fast", cpu, kernels=True).uncorrected_tokens_per_s for s in (all4, head8, float_head)]
    assert tps[0] > tps[1] > tps[2]


def test_narrow_rows_cost_more_per_weight_than_wide_ones():
    """Each output row has a fixed cost in the kernels (ROW_S): the same weights and bytes in fewer, longer rows
    take less time. Q8_0 rows ran at 9-10 G weights/s 576 wide (the starter) and 19-26 at 2,048-8,192."""
    from redline.inference.speed.arithmetic import product_classes

    cpu = Machine("cpu", 25e9, 120e9, "a 2-core CPU", "cpu")
    q8 = parse_precision("q8")
    # Every layer transposed: the same weights, in rows as long as the layer's outputs were many.
    transposed = dataclasses.replace(STARTER, linears=[[n, o, i, b] for n, i, o, b in STARTER.linears])
    (w1, rows1, b1), (w2, rows2, b2) = (product_classes(s, q8)["q8"] for s in (STARTER, transposed))
    assert w1 == w2 and rows2 < rows1 and b2 == pytest.approx(b1, rel=0.01)
    tps = [predict(s, q8, "fast", cpu, kernels=True).uncorrected_tokens_per_s for s in (STARTER, transposed)]
    assert tps[1] > tps[0] * 1.05


def test_a_prompt_of_narrow_layers_costs_more_per_flop_and_its_parts_add_up():
    """A prompt's products cost per output beside their arithmetic (PROMPT_OUTPUT_FLOPS): the same FLOPs in
    narrower layers (more outputs) read slower; a compute-bound prompt's weights read hides behind its arithmetic,
    so the fixed part of the TTFT is its overheads and the two parts add up to the uncorrected TTFT (counting the
    whole read as fixed made a 1B-shaped model's short prompts 29-42 % slow after a calibration on the starter)."""
    from redline.inference.speed.arithmetic import body_outputs

    cpu = Machine("cpu", 25e9, 120e9, "a 2-core CPU", "cpu")
    bf16 = parse_precision("bf16")
    # The same weights (so FLOPs) in layers four times wider and a quarter as many outputs
    wide = dataclasses.replace(STARTER, linears=[[n, 4 * i, o // 4, b] for n, i, o, b in STARTER.linears])
    assert body_outputs(wide) * 4 == body_outputs(STARTER)
    ttft = [predict(s, bf16, "fast", cpu, prompt_tokens=300, kernels=True).ttft_compute_ms for s in (STARTER, wide)]
    assert ttft[0] > ttft[1] * 1.2
    p = predict(STARTER, bf16, "fast", cpu, prompt_tokens=300, kernels=True)
    assert p.ttft_compute_ms + p.ttft_fixed_ms == pytest.approx(p.uncorrected_ttft_ms, rel=1e-6)
    assert p.ttft_fixed_ms < 0.1 * p.uncorrected_ttft_ms


def test_a_packed_tied_head_reads_its_blocks_not_the_table():
    """A GGUF whose tied head stays packed (llama.cpp writes a Q8_0 or Q6_K table) reads the packed head once a
    step and one row of the float table, like an untied model: counted whole, the 1B-shaped Q8_0 file's bf16
    table added 201 MB a step that nothing reads."""
    gguf = parse_precision("gguf")
    packed_head = as_gguf(STARTER, 8)
    float_head = dataclasses.replace(packed_head, packed=[p for p in packed_head.packed if p[0] != "lm_head"])
    head = next(i * o for n, i, o, _b in STARTER.linears if n == "lm_head")
    table = V * H * 2  # bf16
    # The float head reads the table whole (it is the head); the packed one its blocks (1 + 2/32 bytes a weight).
    assert weights_read_bytes(float_head, gguf) - weights_read_bytes(packed_head, gguf) == pytest.approx(
        table - head * 34 / 32 - H * 2, rel=0.01
    )


def test_bitsandbytes_bytes_follow_the_estimator():
    spec = parse_precision("nf4")
    wb = weights_bytes(STARTER, spec, "cpu")
    assert weights_read_bytes(STARTER, spec) == wb.total  # tied head: the unquantised table is read whole
    assert weights_read_bytes(STARTER, spec) < weights_read_bytes(STARTER, parse_precision("bf16"))


def test_kv_cache_read_grows_linearly_with_context():
    fp32, bf16 = parse_precision("fp32"), parse_precision("bf16")
    per_position = 2 * 30 * 3 * 64  # K and V × layers × KV heads × head dim
    assert kv_read_bytes(STARTER, fp32, "cpu", "hf", 1000) == per_position * 4 * 1000
    assert kv_read_bytes(STARTER, bf16, "cpu", "hf", 1000) == per_position * 2 * 1000
    # The fast path keeps a bf16 model's cache in bf16, a q8 model's too (its activations are fp32).
    assert kv_read_bytes(STARTER, parse_precision("q8"), "cpu", "fast", 10) == per_position * 2 * 10
    a, b, c = (predict(STARTER, bf16, "kv", CPU, ctx, 2) for ctx in (100, 4000, 8000))
    assert a.kv_read_bytes < b.kv_read_bytes < c.kv_read_bytes
    assert c.bytes_per_token - b.bytes_per_token == pytest.approx(b.bytes_per_token - a.bytes_per_token, rel=0.05)
    assert a.tokens_per_s > b.tokens_per_s > c.tokens_per_s
    # A sliding-window model stops growing at its window.
    windowed = shipped_starter_shape()
    windowed.layer_windows = [512] * 30
    assert kv_read_bytes(windowed, bf16, "cpu", "hf", 4000) == kv_read_bytes(windowed, bf16, "cpu", "hf", 512)


def test_flops_per_token_and_prefill():
    body = linears_without_head(STARTER)
    one = step_flops(STARTER, 1, 0)
    assert one == pytest.approx(2 * body + 2 * V * H + 4 * 30 * 9 * 64, rel=1e-9)
    # Prefill of T tokens multiplies the body T times; the head runs for the last token only.
    assert step_flops(STARTER, 100, 0) > 99 * 2 * body


def test_decode_is_bandwidth_bound_and_quantised_reads_fewer_bytes():
    preds = {p: predict(STARTER, parse_precision(p), "fast", CPU, 32, 64) for p in ("fp32", "bf16", "q8", "q4")}
    assert preds["fp32"].bytes_per_token > preds["bf16"].bytes_per_token > preds["q8"].bytes_per_token
    assert preds["q8"].bytes_per_token > preds["q4"].bytes_per_token
    for p in preds.values():
        assert p.tokens_per_s < p.roofline_tokens_per_s  # never above the bandwidth bound
    # Twice the bandwidth: the memory part of a step halves, so it gets faster but not twice (overhead).
    fast = Machine("cpu", 40e9, 100e9, "x", "cpu")
    p2 = predict(STARTER, parse_precision("fp32"), "fast", fast, 32, 64)
    assert preds["fp32"].tokens_per_s < p2.tokens_per_s < 2 * preds["fp32"].tokens_per_s


def test_naive_reruns_the_sequence_and_slows_with_length():
    fp32 = parse_precision("fp32")
    kv = predict(STARTER, fp32, "kv", CPU, 32, 256)
    short = predict(STARTER, fp32, "naive", CPU, 32, 16)
    long = predict(STARTER, fp32, "naive", CPU, 32, 256)
    assert long.tokens_per_s < short.tokens_per_s < kv.tokens_per_s
    assert long.bound == "compute"


def test_fast_falls_back_where_the_fast_path_does_not_run():
    gpt2 = shipped_starter_shape()
    gpt2.model_type = "gpt2"
    p = predict(gpt2, parse_precision("bf16"), "fast", CPU)
    assert p.path == "hf" and "predicted as kv" in p.notes[0]
    assert predict(STARTER, parse_precision("nf4"), "fast", CPU).path == "hf"


def test_bytes_match_the_loaded_model(tiny_model_dir):
    """The shape-based count equals what the loaded model's tensors hold (hardware.bandwidth)."""
    from redline.inference.backends.local import load_model
    from redline.inference.estimate.model_shapes import shape_for_folder
    from redline.inference.sources.resolve import resolve
    from redline.inference.speed.arithmetic import weight_bytes_read

    shape = shape_for_folder(tiny_model_dir, "tiny")
    for p in ("fp32", "bf16", "q8", "q4"):
        loaded = load_model(resolve(str(tiny_model_dir)), parse_precision(p), "cpu")
        try:
            layouts = {getattr(m, "layout", None) for m in loaded.model.modules()} - {None}
            if p in ("q8", "q4") and layouts != {"blocks"}:
                continue  # no native kernels here: torch's layouts, which the CPU prediction does not assume
            got = weight_bytes_read(loaded.model)
            # weight_bytes_read adds the rotary buffer (inv_freq): a few hundred bytes
            assert abs(got - weights_read_bytes(shape, parse_precision(p))) <= 1024, p
        finally:
            loaded.release()


# --------------------------------------------------------------------------- speculative arithmetic
def test_speculative_formulas():
    assert tokens_per_step(0.0, 5) == 1.0 and tokens_per_step(1.0, 5) == 6.0
    assert tokens_per_step(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    for alpha in (0.2, 0.6, 0.9):
        rate = (tokens_per_step(alpha, 5) - 1) / 5
        assert token_acceptance(rate, 5) == pytest.approx(alpha, abs=1e-6)
    # A draft as costly as the target can never pay; a cheap one pays above its break-even acceptance.
    assert break_even_acceptance(5, 1.0) is None
    be = break_even_acceptance(5, 0.1)
    assert 0 < be < 1
    assert speculative_speedup(be + 0.05, 5, 0.1) > 1 > speculative_speedup(be - 0.05, 5, 0.1)


def test_starter_drafting_for_itself_is_predicted_slower(tmp_path):
    speed = SpeedModel(CPU, SpeedCalibration(tmp_path / "s.json"))
    adv = advise(speed, STARTER, "fp32", STARTER, "fp32", 5, 256, acceptance_rate=0.95)
    assert adv.cost_ratio == pytest.approx(1.0, rel=0.01)
    assert adv.verdict == "slower" and adv.speedup < 1 and adv.text.startswith("Slower")
    # Unmeasured: it cannot pay at any acceptance, and says so.
    adv = advise(speed, STARTER, "fp32", STARTER, "fp32", 5, 256)
    assert adv.acceptance_rate is None and adv.break_even is None and adv.verdict == "slower"
    # A draft a tenth the size, well accepted: faster, with the predicted tokens/s.
    small = shipped_starter_shape()
    small.name, small.layers, small.kv_layers = "small", 3, 3
    small.linears = [
        row for row in small.linears if not row[0].startswith("model.layers.") or int(row[0].split(".")[2]) < 3
    ]
    small.parameters = sum(i * o for _n, i, o, _b in small.linears if _n != "lm_head") + V * H
    adv = advise(speed, STARTER, "fp32", small, "q8", 5, 256, acceptance_rate=0.8)
    assert adv.cost_ratio < 0.4 and adv.verdict == "faster" and adv.speedup > 1
    assert adv.predicted_tokens_per_s == pytest.approx(adv.target_tokens_per_s * adv.speedup)


# --------------------------------------------------------------------------- calibration
def _measure(cal, shape, precision, strategy, measured_tps, measured_ttft=None, prompt=32, new=64):
    pred = predict(shape, parse_precision(precision), strategy, CPU, prompt, new)
    return cal.record(pred, "cpu", shape.name, measured_tps, measured_ttft, "lab"), pred


def test_calibration_learns_the_median_ratio_and_persists(tmp_path):
    path = tmp_path / "speed-calibration.json"
    cal = SpeedCalibration(path)
    before = SpeedModel(CPU, cal).predict(STARTER, "q8", "fast", 32, 64)
    assert before.calibration == "none" and before.decode_factor == 1.0
    truth = 0.4 * before.uncorrected_tokens_per_s
    for noise in (1.0, 1.1, 0.95, 3.0):  # one outlier: the median ignores it
        _measure(cal, STARTER, "q8", "fast", truth * noise, before.uncorrected_ttft_ms * 2)
    reread = SpeedCalibration(path)  # a new process reads the file
    after = SpeedModel(CPU, reread).predict(STARTER, "q8", "fast", 32, 64)
    assert after.calibration == "class" and after.calibration_samples == 4
    assert after.tokens_per_s == pytest.approx(truth * 1.05, rel=1e-6)  # the median of the four: (1.0 + 1.1) ÷ 2
    assert after.ttft_ms == pytest.approx(2 * before.uncorrected_ttft_ms)
    assert after.measured_tokens_per_s == pytest.approx(truth * 1.05, rel=1e-6)
    assert "measured here" in after.text()
    data = json.loads(path.read_text())
    assert len(data["devices"]["cpu"]["fast:q8"]) == 4


def test_calibration_is_bounded_and_keeps_recent_records(tmp_path):
    cal = SpeedCalibration(tmp_path / "s.json")
    pred = predict(STARTER, parse_precision("fp32"), "kv", CPU, 32, 64)
    assert cal.record(pred, "cpu", "m", pred.uncorrected_tokens_per_s * 200, None, "lab") is None  # broken: skipped
    for _ in range(3):
        cal.record(pred, "cpu", "m", pred.uncorrected_tokens_per_s * 60, None, "lab")
    assert cal.decode_factor("cpu", "kv:fp32").value == MAX_FACTOR
    for _ in range(cal_mod.LEARN_FROM):
        cal.record(pred, "cpu", "m", pred.uncorrected_tokens_per_s / 60, None, "lab")
    assert cal.decode_factor("cpu", "kv:fp32").value == MIN_FACTOR  # only the last LEARN_FROM count
    for _ in range(cal_mod.CLASS_HISTORY + 5):
        cal.record(pred, "cpu", "m", pred.uncorrected_tokens_per_s, None, "lab")
    assert len(cal.data["devices"]["cpu"]["kv:fp32"]) == cal_mod.CLASS_HISTORY


def test_unmeasured_class_borrows_the_device_factor(tmp_path):
    cal = SpeedCalibration(tmp_path / "s.json")
    for p, s in (("fp32", "kv"), ("bf16", "kv"), ("fp32", "fast")):
        pred = predict(STARTER, parse_precision(p), s, CPU, 32, 64)
        cal.record(pred, "cpu", STARTER.name, pred.uncorrected_tokens_per_s * 0.5, None, "lab")
    q4 = SpeedModel(CPU, cal).predict(STARTER, "q4", "fast", 32, 64)
    assert q4.calibration == "device" and q4.decode_factor == pytest.approx(0.5)
    assert q4.measured_tokens_per_s is None
    # Only from its own strategy: the code paths err differently before correction.
    pred = predict(STARTER, parse_precision("bf16"), "fast", CPU, 32, 64)
    for _ in range(3):
        cal.record(pred, "cpu", STARTER.name, pred.uncorrected_tokens_per_s * 3, None, "lab")
    assert SpeedModel(CPU, cal).predict(STARTER, "q8", "fast", 32, 64).decode_factor == pytest.approx(3)  # newest 3
    assert SpeedModel(CPU, cal).predict(STARTER, "q8", "kv", 32, 64).decode_factor == pytest.approx(0.5)
    only_fast = SpeedCalibration(tmp_path / "f.json")
    only_fast.record(pred, "cpu", STARTER.name, pred.uncorrected_tokens_per_s * 3, None, "lab")
    assert SpeedModel(CPU, only_fast).predict(STARTER, "fp32", "kv", 32, 64).calibration == "none"
    # Another device's file entries do not apply; a hypothetical card has none.
    card = SpeedModel(Machine("cuda", 360e9, None, "a card", None), cal).predict(STARTER, "bf16", "kv")
    assert card.calibration == "none"


def test_calibrated_prediction_lands_within_25_percent(tmp_path):
    """One measured run per configuration brings every row within the target (here with a machine whose
    configurations run at different fractions of the defaults)."""
    cal = SpeedCalibration(tmp_path / "s.json")
    truth = {("naive", "fp32"): 0.3, ("kv", "fp32"): 0.5, ("kv", "bf16"): 0.2, ("fast", "q8"): 0.7, ("fast", "q4"): 1.4}
    for (s, p), r in truth.items():
        pred = predict(STARTER, parse_precision(p), s, CPU, 40, 64)
        cal.record(pred, "cpu", STARTER.name, pred.uncorrected_tokens_per_s * r, None, "lab")
    speed = SpeedModel(CPU, cal)
    for (s, p), r in truth.items():
        measured = predict(STARTER, parse_precision(p), s, CPU, 40, 64).uncorrected_tokens_per_s * r * 1.1
        assert abs(speed.predict(STARTER, p, s, 40, 64).tokens_per_s - measured) / measured < 0.25


# --------------------------------------------------------------------------- auto
def _cpu_planner(available_gb: float) -> Planner:
    return Planner(STARTER, Target("cpu", int(available_gb * GB), "test RAM", "cpu"), 1)


def _feed(cal, rows):
    """Measured tokens/s per (strategy, precision) for the starter."""
    for (s, p), tps in rows.items():
        pred = predict(STARTER, parse_precision(p), s, CPU, 64, 256)
        cal.record(pred, "cpu", STARTER.name, tps, None, "chat")


MEASURED = {
    ("kv", "fp32"): 20.0,
    ("fast", "fp32"): 24.0,
    ("kv", "bf16"): 15.0,
    ("fast", "bf16"): 19.0,
    ("kv", "q8"): 30.0,
    ("fast", "q8"): 40.0,
    ("kv", "q4"): 38.0,
    ("fast", "q4"): 55.0,
}


def test_auto_picks_the_measured_fastest_that_fits(tmp_path, monkeypatch):
    monkeypatch.setattr("redline.inference.speed.choose.bitsandbytes_available", lambda: False)
    cal = SpeedCalibration(tmp_path / "s.json")
    _feed(cal, MEASURED)
    speed = SpeedModel(CPU, cal)
    planner = _cpu_planner(16)
    balanced = choose(STARTER, planner, speed, 2048, "balanced")
    assert (balanced.strategy, balanced.precision) == ("fast", "q8")  # q4 is faster but below 8 bits
    assert balanced.tokens_per_s == pytest.approx(40.0, rel=0.05)
    assert balanced.reason.startswith("auto: fast · q8 — fastest that fits with 8-bit weights (≈ 40 tok/s")
    fastest = choose(STARTER, planner, speed, 2048, "speed")
    assert (fastest.strategy, fastest.precision) == ("fast", "q4")
    quality = choose(STARTER, planner, speed, 2048, "quality")
    assert (quality.strategy, quality.precision) == ("fast", "bf16")  # today's order, then its fastest strategy
    pinned = choose(STARTER, planner, speed, 2048, "balanced", strategy="kv")
    assert (pinned.strategy, pinned.precision) == ("kv", "q8")
    pinned = choose(STARTER, planner, speed, 2048, "balanced", precision="fp32")
    assert (pinned.strategy, pinned.precision) == ("fast", "fp32")
    # Measurements change the choice: if fp32 measures fastest here, balanced takes it.
    _feed(cal, {("fast", "fp32"): 80.0} | {k: v for k, v in MEASURED.items() if k != ("fast", "fp32")})
    _feed(cal, {("fast", "fp32"): 80.0})
    assert choose(STARTER, planner, SpeedModel(CPU, cal), 2048, "balanced").precision == "fp32"


def test_auto_only_considers_what_fits(tmp_path, monkeypatch):
    monkeypatch.setattr("redline.inference.speed.choose.bitsandbytes_available", lambda: False)
    cal = SpeedCalibration(tmp_path / "s.json")
    _feed(cal, MEASURED | {("fast", "fp32"): 80.0})
    speed = SpeedModel(CPU, cal)
    # fp32 is measured fastest, but at 8192 tokens only the smaller precisions fit in 1.75 GB.
    planner = _cpu_planner(1.75)
    fp32 = planner.estimate(parse_precision("fp32"), 8192)
    q8 = planner.estimate(parse_precision("q8"), 8192)
    assert not fp32.fits and q8.fits
    choice = choose(STARTER, planner, speed, 8192, "balanced")
    assert choice.precision == "q8" and choice.fits
    assert any(c.precision == "fp32" and not c.fits for c in choice.candidates)
    # Nothing fits at all: said so, with the memory suggestion's sentence.
    none = choose(STARTER, _cpu_planner(0.2), speed, 8192, "balanced")
    assert not none.fits and "nothing fits" in none.reason


BUSY = 0.7  # other programs used 70 % of the cores while these replies were measured


def test_a_handful_of_replies_measured_on_a_busy_machine_does_not_flip_auto(tmp_path, monkeypatch):
    """Two fast:q8 replies slowed by other programs turned "auto: fast · q8 ≈ 49 tok/s" into kv: a record taken
    while the machine was busy is set aside while its class has quiet ones, and the status line says so."""
    monkeypatch.setattr("redline.inference.speed.choose.bitsandbytes_available", lambda: False)
    cal = SpeedCalibration(tmp_path / "s.json")
    _feed(cal, MEASURED)
    pred = predict(STARTER, parse_precision("q8"), "fast", CPU, 64, 256)
    for _ in range(2):
        cal.record(pred, "cpu", STARTER.name, 3.0, None, "chat", others_cpu_share=BUSY, load_average=6.0)
    choice = choose(STARTER, _cpu_planner(16), SpeedModel(CPU, cal), 2048, "balanced")
    assert (choice.strategy, choice.precision) == ("fast", "q8") and choice.tokens_per_s == pytest.approx(40, rel=0.05)
    assert "2 measured while the machine was busy set aside" in choice.reason
    # A class measured only under load: not on a handful of records; once it is the rule here, from them.
    only_busy = SpeedCalibration(tmp_path / "b.json")
    for n in range(1, cal_mod.BUSY_QUORUM + 1):
        only_busy.record(pred, "cpu", STARTER.name, 3.0, None, "chat", others_cpu_share=BUSY)
        factor = only_busy.decode_factor("cpu", "fast:q8")
        assert (factor.source == "class") == (n >= cal_mod.BUSY_QUORUM), n
    # Where no share of the cores was watched (a speed-lab row), the load average against the cores says it.
    assert cal_mod.was_busy({"load_average": 9.0, "cpus": 2}) and not cal_mod.was_busy({"load_average": 1.5, "cpus": 2})
    assert not cal_mod.was_busy({"others_cpu_share": 0.05, "load_average": 9.0, "cpus": 2})


def test_an_unmeasured_class_never_beats_a_measured_one_on_a_borrowed_factor(tmp_path, monkeypatch):
    """kv:q8, never measured, borrows kv:bf16's factor (its replies here ran 10 % faster than predicted) and is so
    predicted faster than fast:q8 and kv:bf16, both measured. Its uncorrected prediction is below fast:q8's: the
    borrowed factor alone puts it ahead, so a measured configuration is chosen, and the status line says why."""
    monkeypatch.setattr("redline.inference.speed.choose.bitsandbytes_available", lambda: False)
    cal = SpeedCalibration(tmp_path / "s.json")
    for _ in range(4):
        _feed(cal, {("fast", "q8"): 3.0, ("kv", "bf16"): 20.0})
    choice = choose(STARTER, _cpu_planner(16), SpeedModel(CPU, cal), 2048, "balanced")
    first = next(c for c in choice.candidates if c.fits)
    assert (first.strategy, first.precision, first.calibration) == ("kv", "q8", "device")  # the factors' ranking
    assert (choice.strategy, choice.precision) == ("kv", "bf16")
    assert "not kv · q8" in choice.reason and "borrowed factor" in choice.reason
    assert "learned from 4 of its replies here" in choice.reason
    # Ahead on its own uncorrected prediction too, an unmeasured configuration still wins (nothing measured beats
    # the fast path's q8 here before correction).
    slow = SpeedCalibration(tmp_path / "k.json")
    _feed(slow, {("kv", "fp32"): 18.0})
    pick = choose(STARTER, _cpu_planner(16), SpeedModel(CPU, slow), 2048, "balanced")
    assert (pick.strategy, pick.precision) == ("fast", "q8") and "nothing measured here yet" in pick.reason


def test_records_made_against_other_machine_figures_do_not_teach(tmp_path):
    """A ratio is against the bandwidth and FLOP/s its prediction started from: once those are measured again (a
    busy read replaced by a quiet one), the records made against the old figures no longer apply."""
    cal = SpeedCalibration(tmp_path / "s.json")
    busy_read = Machine("cpu", 12.5e9, 78e9, "a CPU read while a build ran", "cpu")
    pred = predict(STARTER, parse_precision("q8"), "fast", busy_read, 64, 256)
    cal.record(pred, "cpu", STARTER.name, pred.uncorrected_tokens_per_s * 1.6, None, "chat")
    assert SpeedModel(busy_read, cal).predict(STARTER, "q8", "fast", 64, 256).decode_factor == pytest.approx(1.6)
    quiet_read = Machine("cpu", 20e9, 100e9, "the same CPU read quiet", "cpu")
    again = SpeedModel(quiet_read, cal).predict(STARTER, "q8", "fast", 64, 256)
    assert again.calibration == "none" and again.decode_factor == 1.0
    # A record from before records kept their figures still teaches (it cannot be told apart).
    del cal.data["devices"]["cpu"]["fast:q8"][0]["bandwidth_bytes_per_s"]
    assert SpeedModel(quiet_read, cal).predict(STARTER, "q8", "fast", 64, 256).calibration == "class"


# --------------------------------------------------------------------------- the engine, the lab, the CLI
def test_chat_replies_and_lab_rows_feed_the_calibration(tiny_model_dir, tmp_path, monkeypatch):
    from redline.inference.bench.configs import parse_configs
    from redline.inference.bench.lab import BenchSpec, run_bench
    from redline.inference.bench.prompts import load_prompt_set
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.engine import Engine

    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    engine = Engine("cpu")
    engine.load(str(tiny_model_dir), parse_precision("fp32"))
    sampling = SamplingSettings(max_new_tokens=16, min_new_tokens=16, temperature=0)
    result = engine.chat([{"role": "user", "content": "Paris"}], sampling, DecodeOptions(strategy="kv"))
    assert result.predicted_tokens_per_s > 0 and result.predicted_ttft_ms > 0
    assert engine.speed_check.calibration == "none"  # the first reply: nothing learned before it
    data = json.loads((tmp_path / "speed-calibration.json").read_text())
    [rec] = data["devices"]["cpu"]["kv:fp32"]
    assert rec["source"] == "chat" and rec["measured_tokens_per_s"] == result.tokens_per_s
    assert rec["decode_ratio"] == pytest.approx(result.tokens_per_s / rec["predicted_tokens_per_s"], rel=1e-3)
    # The next reply's prediction is corrected by the first one.
    again = engine.chat([{"role": "user", "content": "Paris"}], sampling, DecodeOptions(strategy="kv"))
    assert engine.speed_check.calibration == "class"
    assert again.predicted_tokens_per_s == pytest.approx(result.tokens_per_s, rel=0.02)
    # A too-short reply teaches nothing.
    engine.chat([{"role": "user", "content": "x"}], SamplingSettings(max_new_tokens=2, temperature=0), DecodeOptions())
    assert len(json.loads((tmp_path / "speed-calibration.json").read_text())["devices"]["cpu"]["kv:fp32"]) == 2

    prompts = load_prompt_set("short")
    prompts.prompts = prompts.prompts[:1]
    spec = BenchSpec(
        str(tiny_model_dir), parse_configs("kv:fp32,fast:fp32"), prompts, new_tokens=12, warmup=0, samples=1
    )
    report = run_bench(engine, spec)
    for row in report.results:
        assert row.status == "ok" and row.predicted_tokens_per_s and row.predicted_ttft_ms
        assert row.prediction_error_pct == pytest.approx(
            100 * (row.predicted_tokens_per_s - row.tokens_per_s) / row.tokens_per_s, abs=0.2
        )
    assert report.results[0].prediction_calibration == "class"  # learned from the chat replies
    data = json.loads((tmp_path / "speed-calibration.json").read_text())
    assert data["devices"]["cpu"]["kv:fp32"][-1]["source"] == "lab" and "fast:fp32" in data["devices"]["cpu"]


def test_speculative_rows_keep_their_acceptance(tiny_model_dir, tiny_draft_dir, tmp_path, monkeypatch):
    from redline.inference.engine import Engine
    from redline.inference.speed.speculative import measure_acceptance

    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    engine = Engine("cpu")
    run = measure_acceptance(engine, str(tiny_model_dir), "fp32", str(tiny_draft_dir), "fp32", k=3, tokens=24)
    assert run.proposed > 0 and 0 <= run.acceptance_rate <= 1 and run.new_tokens == 24
    assert engine.target is None  # loaded for the run only: the engine's own model is untouched
    cal = SpeedCalibration()
    assert cal.acceptance("tiny-llama", "tiny-draft", "fp32", 3) == pytest.approx(run.acceptance_rate)


def test_cli_chat_and_the_window_resolve_auto_alike(tiny_model_dir, tmp_path, monkeypatch):
    from redline.app import cli
    from redline.app.cli_chat import resolve_auto_args
    from redline.inference.engine import Engine
    from redline.inference.estimate.model_shapes import read_shape
    from redline.inference.jobs import auto_job
    from redline.inference.speed.arithmetic import this_machine

    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    engine = Engine("cpu")
    shape, machine = read_shape(str(tiny_model_dir)), this_machine("cpu")
    cal = SpeedCalibration()
    for (s, p), tps in {("kv", "q8"): 500.0, ("fast", "q8"): 100.0, ("fast", "fp32"): 90.0}.items():
        pred = predict(shape, parse_precision(p), s, machine, 64, 256)
        cal.record(pred, "cpu", shape.name, tps, None, "chat")
    args = cli.build_parser().parse_args(["chat", "hi", "--model", str(tiny_model_dir)])
    assert (args.precision, args.strategy, args.priority) == ("auto", "auto", "balanced")
    cli_choice = resolve_auto_args(engine.device, args, quiet=True)
    window_choice = auto_job(str(tiny_model_dir), "auto", "auto", "balanced", None)(engine, None)
    assert (args.precision, args.strategy) == ("q8", "kv")  # measured fastest here
    assert (window_choice.precision, window_choice.strategy) == (
        "q8",
        "kv",
    ) and cli_choice.reason == window_choice.reason
    pinned = cli.build_parser().parse_args(["chat", "hi", "--model", str(tiny_model_dir), "--strategy", "fast"])
    resolve_auto_args(engine.device, pinned, quiet=True)
    assert (pinned.precision, pinned.strategy) == ("q8", "fast")


def test_estimate_cli_shows_speed(capsys, tmp_path, monkeypatch):
    from redline.app.cli import main

    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    assert main(["estimate", "starter", "--free-gb", "16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    speed = report["speed"]
    rows = {(r["precision"], r["strategy"]): r for r in speed["predictions"]}
    assert ("q8", "fast") in rows and ("nf4", "fast") not in rows  # the fast path does not run bitsandbytes
    assert rows[("q8", "fast")]["bytes_per_token"] < rows[("bf16", "fast")]["bytes_per_token"]
    assert all(r["tokens_per_s_full_context"] < r["tokens_per_s"] for r in rows.values())
    assert set(speed["auto"]) == {"quality", "balanced", "speed"}
    assert speed["auto"]["balanced"]["precision"] in ("fp32", "bf16", "q8", "int8")
    assert main(["estimate", "starter", "--free-gb", "16", "--draft", "starter"]) == 0
    out = capsys.readouterr().out
    assert "tok/s at 8192" in out and "auto: " in out and "draft: Slower" in out


# --------------------------------------------------------------------------- a turn whose prefix is cached
def test_a_cached_prefix_shortens_the_predicted_ttft_to_the_new_tokens():
    spec = parse_precision("q8")
    fresh = predict(STARTER, spec, "fast", CPU, 1000, 64)
    turn = predict(STARTER, spec, "fast", CPU, 1000, 64, cached_tokens=870)
    new_only = predict(STARTER, spec, "fast", CPU, 130, 64)
    assert turn.cached_tokens == 870 and fresh.cached_tokens == 0
    # 130 tokens read, attending to 870 cached ones: dearer than 130 fresh tokens, far cheaper than 1,000.
    assert new_only.ttft_ms < turn.ttft_ms < fresh.ttft_ms / 3
    # The decode speed does not depend on where the prompt came from.
    assert turn.tokens_per_s == pytest.approx(fresh.tokens_per_s)
    # At least the last prompt token is always read (its logits are the reply's first); kv keeps no cache.
    assert predict(STARTER, spec, "fast", CPU, 100, 64, cached_tokens=500).cached_tokens == 99
    assert predict(STARTER, spec, "kv", CPU, 1000, 64, cached_tokens=870).cached_tokens == 0


def test_a_cached_turn_teaches_the_calibration_against_its_own_prefill(tiny_model_dir, tmp_path, monkeypatch):
    """A turn read mostly from the prefix cache is compared with the prediction for what it really read: against a
    whole prompt's prefill its short TTFT would make every later prediction too low."""
    from redline.inference.decoding.options import DecodeOptions, SamplingSettings
    from redline.inference.engine import Engine

    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    engine = Engine("cpu")
    engine.load(str(tiny_model_dir), parse_precision("fp32"))
    sampling = SamplingSettings(max_new_tokens=12, min_new_tokens=12, temperature=0)
    history = [{"role": "user", "content": "Tell me about the sea " * 8}]
    first = engine.chat(history, sampling, DecodeOptions(strategy="fast"))
    history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And the sky?"}]
    second = engine.chat(history, sampling, DecodeOptions(strategy="fast"))
    assert second.cached_tokens > 0
    records = json.loads((tmp_path / "speed-calibration.json").read_text())["devices"]["cpu"]["fast:fp32"]
    assert [r["cached_tokens"] for r in records] == [0, second.cached_tokens]
    from redline.inference.speed.arithmetic import this_machine

    shape = engine.target.estimate_shape
    expected = predict(
        shape, engine.target.precision, "fast", this_machine("cpu"), second.prompt_tokens, second.new_tokens,
        cached_tokens=second.cached_tokens,
    )  # fmt: skip
    assert records[1]["predicted_ttft_ms"] == pytest.approx(expected.uncorrected_ttft_ms, rel=1e-3)
    assert records[1]["ttft_ratio"] == pytest.approx(second.ttft_ms / records[1]["predicted_ttft_ms"], rel=1e-2)


def test_estimate_shows_the_next_turns_ttft(capsys, tmp_path, monkeypatch):
    from redline.app.cli import main

    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    assert main(["estimate", "starter", "--free-gb", "16", "--json"]) == 0
    rows = {(r["precision"], r["strategy"]): r for r in json.loads(capsys.readouterr().out)["speed"]["predictions"]}
    fast, kv = rows[("q8", "fast")], rows[("q8", "kv")]
    assert fast["next_turn_cached_tokens"] > 0 and kv["next_turn_cached_tokens"] == 0
    assert fast["ttft_ms_next_turn"] < fast["ttft_ms_full_context"] / 3  # the cache holds all but the message
    assert kv["ttft_ms_next_turn"] == pytest.approx(kv["ttft_ms_full_context"])  # kv reads it all again
    assert main(["estimate", "starter", "--free-gb", "16"]) == 0
    assert "TTFT next turn" in capsys.readouterr().out


def test_ttft_is_fitted_in_two_parts_from_replies_of_several_lengths(tmp_path):
    """A per-FLOP part and a fixed part, fitted from replies at 44 and 300 tokens, carry to another model where
    one factor cannot: the fixed part does not grow with the prompt."""
    from redline.inference.speed.calibration import FIT_SPAN

    cal = SpeedCalibration(tmp_path / "s.json")
    bf16 = parse_precision("bf16")
    alpha, beta = 0.1, 2.5

    def truth(p):
        return alpha * p.ttft_compute_ms + beta * p.ttft_fixed_ms

    first = predict(STARTER, bf16, "fast", CPU, 44, 16)
    cal.record(first, "cpu", STARTER.name, 50.0, truth(first), "chat")
    assert cal.ttft_fit("cpu", "fast:bf16") is None  # one length: a fixed cost and a per-FLOP one look alike
    near = predict(STARTER, bf16, "fast", CPU, 44 * FIT_SPAN - 1, 16)
    cal.record(near, "cpu", STARTER.name, 50.0, truth(near), "chat")
    assert cal.ttft_fit("cpu", "fast:bf16") is None  # still too close together
    for n in (300, 44, 300):
        p = predict(STARTER, bf16, "fast", CPU, n, 16)
        cal.record(p, "cpu", STARTER.name, 50.0, truth(p), "chat")
    fit = cal.ttft_fit("cpu", "fast:bf16")
    assert fit == pytest.approx((alpha, beta), rel=1e-3)
    wide = dataclasses.replace(STARTER, layers=16, hidden=2048, intermediate=8192, heads=32, kv_heads=8, head_dim=64)
    wide.parameters = 1_235_814_400
    got = SpeedModel(CPU, cal).predict(wide, "bf16", "fast", 44, 16)
    assert got.ttft_fit == pytest.approx((alpha, beta), rel=1e-3)
    assert got.ttft_ms == pytest.approx(truth(got), rel=1e-3)
    # The single factor (the median of measured / predicted) would have been off on the other model.
    assert abs(got.uncorrected_ttft_ms * got.ttft_factor - truth(got)) > 0.05 * truth(got)
    # A class without several lengths keeps its single factor.
    q8 = predict(STARTER, parse_precision("q8"), "fast", CPU, 44, 16)
    cal.record(q8, "cpu", STARTER.name, 50.0, 2 * q8.uncorrected_ttft_ms, "chat")
    one = SpeedModel(CPU, cal).predict(STARTER, "q8", "fast", 44, 16)
    assert one.ttft_fit is None and one.ttft_ms == pytest.approx(2 * one.uncorrected_ttft_ms)
