"""The 8-bit KV cache counted where it is chosen (issue 48, item 2): the speed model reads its rows, the planner
estimates it where the fast path keeps it, and ``auto`` takes it when only it makes the context fit. Arithmetic on
the starter's shipped shape: no torch, no weights."""

from __future__ import annotations

import pytest

from redline.inference.cost import kv_read_bytes
from redline.inference.estimate.fit import Planner, Target
from redline.inference.estimate.model_shapes import shipped_starter_shape
from redline.inference.precision import parse_precision
from redline.inference.speed.arithmetic import Machine, predict
from redline.inference.speed.calibration import SpeedCalibration
from redline.inference.speed.choose import choose
from redline.inference.speed.model import SpeedModel
from redline.inference.units import GB

STARTER = shipped_starter_shape()
CPU = Machine("cpu", 20e9, 100e9, "a test CPU", "cpu")
Q8, BF16 = parse_precision("q8"), parse_precision("bf16")
PER_TOKEN_BF16 = 2 * 30 * 3 * 64 * 2  # K and V × layers × KV heads × head dim × 2 bytes
PER_TOKEN_Q8 = 2 * 30 * 3 * (64 + 2)  # int8 rows and an fp16 scale each


@pytest.fixture(autouse=True)
def kernels_run(monkeypatch):
    """Redline's CPU kernels run here, whatever this machine has."""
    monkeypatch.setattr("redline.inference.cost.will_run", lambda: None)


def _planner(available_gb: float, kv: str = "bf16") -> Planner:
    return Planner(STARTER, Target("cpu", int(available_gb * GB), "test RAM", "cpu"), 1, kv=kv)


def test_a_decode_step_reads_the_8bit_rows_and_is_predicted_faster():
    assert kv_read_bytes(STARTER, Q8, "cpu", "fast", 1000, "q8") == PER_TOKEN_Q8 * 1000
    wide = predict(STARTER, Q8, "fast", CPU, 4000, 2, kernels=True)
    narrow = predict(STARTER, Q8, "fast", CPU, 4000, 2, kernels=True, kv="q8")
    assert wide.kv_read_bytes == PER_TOKEN_BF16 * 4001 and narrow.kv_read_bytes == PER_TOKEN_Q8 * 4001
    assert narrow.bytes_per_token == wide.bytes_per_token - (PER_TOKEN_BF16 - PER_TOKEN_Q8) * 4001
    assert narrow.tokens_per_s > wide.tokens_per_s
    # transformers' cache (kv) stays in the compute dtype whatever the form asked.
    hf = predict(STARTER, Q8, "kv", CPU, 4000, 2, kv="q8")
    assert hf.kv_read_bytes == predict(STARTER, Q8, "kv", CPU, 4000, 2).kv_read_bytes
    # SpeedModel and a next turn pass the form on.
    speed = SpeedModel(CPU, SpeedCalibration(None))
    assert speed.predict(STARTER, "q8", "fast", 4000, 2, kv="q8").kv_read_bytes == narrow.kv_read_bytes
    assert speed.next_turn(STARTER, "q8", "fast", 8192, kv="q8").kv_read_bytes < (
        speed.next_turn(STARTER, "q8", "fast", 8192).kv_read_bytes
    )


def test_the_planner_counts_8bit_kv_only_where_the_fast_path_keeps_it():
    eight = _planner(16, "q8")
    assert eight.estimate(Q8, 8192).kv_cache_bytes == PER_TOKEN_Q8 * 8192
    assert eight.estimate(Q8, 8192, strategy="fast").kv_cache_bytes == PER_TOKEN_Q8 * 8192
    assert eight.estimate(Q8, 8192, strategy="kv").kv_cache_bytes == PER_TOKEN_BF16 * 8192
    assert _planner(16).estimate(Q8, 8192).kv_cache_bytes == PER_TOKEN_BF16 * 8192
    assert eight.with_kv("bf16").kv == "bf16" and eight.kv == "q8"


def _tight(context: int, spec=Q8, others=("fp32", "bf16", "q8")) -> float:
    """GB in which fast at ``spec`` fits at ``context`` with an 8-bit cache and none of ``others`` with a 16-bit
    one, with either strategy."""
    fits8 = _planner(16, "q8").estimate(spec, context, strategy="fast")
    need16 = min(
        e.total_bytes + e.margin_bytes
        for p in others
        for s in (None, "kv", "fast")
        for e in [_planner(16).estimate(parse_precision(p), context, strategy=s)]
    )
    need8 = fits8.total_bytes + fits8.margin_bytes
    assert need8 < need16
    return (need8 + need16) / 2 / GB


def test_auto_takes_8bit_kv_when_only_it_makes_the_context_fit(monkeypatch):
    monkeypatch.setattr("redline.inference.speed.choose.bitsandbytes_available", lambda: False)
    speed = SpeedModel(CPU, SpeedCalibration(None))
    gb = _tight(8192)
    choice = choose(STARTER, _planner(gb), speed, 8192, "balanced")
    assert choice.fits and choice.kv == "q8" and (choice.strategy, choice.precision) == ("fast", "q8")
    assert "with the KV cache in 8 bits: at 8,192 tokens a 16-bit cache (189 MB) would not fit" in choice.reason
    assert choice.reason.startswith("auto: fast · q8 · 8-bit KV — fastest that fits with 8-bit weights")
    assert choice.reason.endswith("an 8-bit one (97.3 MB) does")
    assert choice.to_dict()["kv"] == "q8"
    # Room enough for a 16-bit cache: it stays 16-bit; a form set to 8 bits stays 8-bit with fast.
    roomy = choose(STARTER, _planner(16), speed, 8192, "balanced")
    assert roomy.kv == "bf16" and "8 bits" not in roomy.reason
    assert choose(STARTER, _planner(16, "q8"), speed, 8192, "balanced").kv == "q8"
    # kv pinned: transformers' cache cannot be 8-bit, so nothing fits, as before.
    pinned = choose(STARTER, _planner(gb), speed, 8192, "balanced", strategy="kv")
    assert not pinned.fits and pinned.kv == "bf16"
    # quality: the highest precision that fits (bf16 here), with the 8-bit cache where only that makes it fit (q8
    # weights, on the memory suggestion's ladder where the kernels run, do not fit with a 16-bit cache either).
    quality = choose(STARTER, _planner(_tight(8192, BF16, ("bf16", "q8"))), speed, 8192, "quality")
    assert quality.fits and (quality.kv, quality.strategy, quality.precision) == ("q8", "fast", "bf16")
    # Where q8 weights fit with the 16-bit cache, quality takes them first: the ladder's next rung, the cache as set.
    rung = choose(STARTER, _planner(_tight(8192, BF16, ("bf16",))), speed, 8192, "quality")
    assert rung.fits and (rung.kv, rung.precision) == ("bf16", "q8")


def test_auto_resolves_with_the_form_set_and_the_cli_loads_what_it_chose(monkeypatch, tmp_path):
    from argparse import Namespace

    from redline.app import cli_chat
    from redline.inference.speed import choose as choose_mod

    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(choose_mod.arithmetic, "this_machine", lambda device="cpu": CPU)
    monkeypatch.setattr(choose_mod, "bitsandbytes_available", lambda: False)
    gb = _tight(8192)
    got = choose_mod.resolve_auto("starter", "cpu", context=8192, free_gb=gb)
    assert got.kv == "q8"
    seen = {}
    real = choose_mod.resolve_auto

    def spy(*a, **kw):
        seen.update(kw)
        return real(*a, **{**kw, "free_gb": gb})

    monkeypatch.setattr(cli_chat, "resolve_auto", spy)
    args = Namespace(model="starter", precision="auto", strategy="auto", priority="balanced", context=8192, kv="bf16")
    cli_chat.resolve_auto_args("cpu", args, quiet=True)
    assert seen["kv"] == "bf16" and args.kv == "q8" and args.precision == "q8"


@pytest.mark.parametrize("form", ["bf16", "q8"])
def test_the_auto_job_hands_the_form_on(form, monkeypatch):
    from redline.inference import jobs

    seen = {}
    monkeypatch.setattr(jobs, "resolve_auto", lambda *a, **kw: seen.update(kw) or "choice")
    engine = type("E", (), {"device": "cpu", "target": None, "draft": None})()
    assert jobs.auto_job("starter", "auto", "auto", "balanced", None, form)(engine, None) == "choice"
    assert seen["kv"] == form


# --------------------------------------------------------------------------- the wizard's configuration page
class _Wizard:
    """What the configuration page reads of its wizard: the starter's shape, a target of ``gb``, this test's CPU."""

    def __init__(self, gb: float):
        from types import SimpleNamespace

        self.model = SimpleNamespace(shape=STARTER, name="starter")
        self.target = Target("cpu", int(gb * GB), "test RAM", "cpu")
        self.correction, self.priority, self.kv, self.context = 0, "balanced", "bf16", None
        self.found_precision = None
        self.model_page = SimpleNamespace(picker=SimpleNamespace(spec=lambda: "starter"))

    def speed_model(self):
        return SpeedModel(CPU, SpeedCalibration(None))


def test_the_wizard_offers_the_8bit_cache_when_only_it_makes_the_context_fit(qtbot, monkeypatch):
    from redline.ui.wizard.config_page import ConfigPage

    monkeypatch.setattr("redline.inference.speed.choose.bitsandbytes_available", lambda: False)
    wiz = _Wizard(_tight(8192))
    page = ConfigPage(wiz)
    qtbot.addWidget(page)
    page.initializePage()
    assert page.context.value() == 8192 and page.kv.currentData() == "bf16"
    assert [page.kv.itemText(i) for i in range(page.kv.count())] == ["16-bit", "8-bit"]
    assert page.choice.kv == "q8" and page.fix_kv and page.fix_context is None
    assert "Keep the KV cache in 8 bits (fast · q8 then fits)" == page.fix_button.text()
    assert "with the KV cache in 8 bits: at 8,192 tokens" in page.why.text()
    assert page.selected_row() is None
    page.fix_button.click()  # the one change, applied: the context stays
    assert page.kv.currentData() == "q8" and wiz.kv == "q8" and page.context.value() == 8192
    assert not page.fix_kv and page.selected_precision() == "q8" and page.isComplete()
    row = page.shown.index("q8")
    assert page.estimates[row].kv_cache_bytes == PER_TOKEN_Q8 * 8192 and page.estimates[row].fits
    assert page.speeds["q8"].kv_read_bytes < predict(STARTER, Q8, "fast", CPU, 64, 256).kv_read_bytes
    page.validatePage()
    assert wiz.kv == "q8" and wiz.precision == "q8" and wiz.context == 8192


def test_the_wizards_choice_reaches_the_settings():
    from types import SimpleNamespace

    from redline.app.settings import Settings
    from redline.ui.wizard.wizard import ConfigWizard

    fake = SimpleNamespace(
        host=SimpleNamespace(settings=Settings()),
        model=SimpleNamespace(spec="starter"),
        precision="q8",
        context=8192,
        strategy="auto",
        priority="balanced",
        kv="q8",
        draft_model=None,
        draft_precision=None,
        num_draft_tokens=5,
    )
    values = ConfigWizard.settings_values(fake)
    assert values["kv_cache"] == "q8" and Settings(**values).kv_cache == "q8"


def test_speed_first_takes_8bit_kv_where_a_long_context_makes_it_faster(monkeypatch, tmp_path):
    """Under the speed priority the fast path with the 8-bit cache is ranked too, and taken where the cache is a real
    share of a step at the context and the 8-bit one is predicted faster there; balanced and quality keep 16 bits
    where it fits (its quality cost is the user's call), and so does a short context."""
    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    monkeypatch.setattr("redline.inference.speed.choose.bitsandbytes_available", lambda: False)
    speed = SpeedModel(CPU, SpeedCalibration(None))
    long = choose(STARTER, _planner(16), speed, 8192, "speed")
    assert long.fits and (long.kv, long.strategy, long.precision) == ("q8", "fast", "q4")
    assert long.reason.startswith("auto: fast · q4 · 8-bit KV — fastest that fits")
    narrow = speed.predict(STARTER, "q4", "fast", 8192 - 256, 256, kv="q8").tokens_per_s
    wide = speed.predict(STARTER, "q4", "fast", 8192 - 256, 256).tokens_per_s
    assert narrow > wide
    assert long.reason.endswith(f"; 8-bit KV: ≈ {narrow:.0f} tok/s at 8,192 tokens against {wide:.0f} with 16-bit")
    assert [(c.strategy, c.kv) for c in long.candidates[:2]] == [("fast", "q8"), ("fast", "bf16")]
    for priority in ("balanced", "quality"):
        kept = choose(STARTER, _planner(16), speed, 8192, priority)
        assert kept.kv == "bf16" and "KV" not in kept.reason
    assert choose(STARTER, _planner(16), speed, 512, "speed").kv == "bf16"  # the cache a small share: as set
    assert choose(STARTER, _planner(16), speed, 8192, "speed", strategy="kv").kv == "bf16"  # transformers' cache


def test_the_wizard_offers_the_8bit_cache_as_faster_at_a_long_context_under_speed_first(qtbot, monkeypatch, tmp_path):
    """Where every row fits, speed first still offers the 8-bit cache when auto found it faster at the context: the
    button says so ("faster at long contexts", not "then fits"), and taking it keeps the context."""
    from redline.ui.wizard.config_page import ConfigPage

    monkeypatch.setenv("REDLINE_DATA_DIR", str(tmp_path))
    monkeypatch.setattr("redline.inference.speed.choose.bitsandbytes_available", lambda: False)
    wiz = _Wizard(16)
    wiz.priority, wiz.context = "speed", 8192
    page = ConfigPage(wiz)
    qtbot.addWidget(page)
    page.initializePage()
    page.context.setValue(8192)
    assert all(e.fits for e in page.estimates)
    assert page.choice.kv == "q8" and page.fix_kv
    assert (
        page.fix_button.text()
        == f"Keep the KV cache in 8 bits (fast · {page.choice.precision} faster at long contexts)"
    )
    page.fix_button.click()
    assert page.kv.currentData() == "q8" and wiz.kv == "q8" and page.context.value() == 8192
    page.context.setValue(512)  # a short context: the cache a small share of a step, nothing to offer
    page.kv.setCurrentIndex(page.kv.findData("bf16"))
    assert not page.fix_kv
