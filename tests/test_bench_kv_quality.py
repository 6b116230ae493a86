"""What the KV cache in 8 bits costs, in the speed lab (issue 48, item 5): a row's KV form (``+kv=q8|bf16``), a q8
row's agreement with the same row in bf16 KV and the perplexity difference, in the table, the JSON and the panel."""

from __future__ import annotations

import json

import pytest

from redline.inference.bench.configs import BenchConfig, parse_config, parse_configs
from redline.inference.bench.export import KV_COLUMNS, table_rows, to_json, to_text
from redline.inference.bench.kv_quality import agreement, compare, completed_pairs, pairs, pooled
from redline.inference.bench.results import BenchReport, ConfigResult
from redline.inference.errors import UnsupportedConfiguration


# -- the agreement, torch-free ---------------------------------------------------------------------------------------
def test_identical_outputs_agree_wholly():
    found = agreement([1, 2, 3, 4], [1, 2, 3, 4])
    assert (found.matched, found.compared, found.first_diff, found.share) == (4, 4, None, 1.0)


def test_outputs_diverging_at_k_count_the_matched_positions_after_it_too():
    found = agreement([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 5, 6, 0, 8])
    assert found.first_diff == 3 and found.matched == 6 and found.share == pytest.approx(0.75)


def test_outputs_of_different_lengths_differ_where_the_shorter_ends():
    shorter = agreement([1, 2, 3, 4], [1, 2])
    assert (shorter.first_diff, shorter.matched, shorter.compared) == (2, 2, 4)
    assert agreement([1, 2], [1, 2, 3, 4]).share == pytest.approx(0.5)
    assert agreement([], []).share is None


def test_prompts_pool_their_positions_and_keep_the_earliest_difference():
    found = pooled([[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 3, 0], [5, 0, 7, 8]])
    assert (found.matched, found.compared, found.first_diff) == (6, 8, 1)


# -- a row's KV form -------------------------------------------------------------------------------------------------
def test_a_fast_row_names_its_kv_form_and_the_label_keeps_it():
    q8, bf16, plain = parse_configs("fast:q8+kv=q8,fast:q8+kv=bf16,fast:q8")
    assert (q8.kv, bf16.kv, plain.kv) == ("q8", "bf16", None)
    assert BenchConfig(strategy="fast", precision="q8", kv="q8").label == "fast:q8+kv=q8"
    assert parse_config("fast+kv=q8").kv == "q8"


@pytest.mark.parametrize(
    "text, words",
    [("fast:q8+kv=q4", "kv= takes bf16 or q8"), ("kv:bf16+kv=q8", "only fast rows"), ("naive:fp32+kv=bf16", "only")],
)
def test_a_kv_form_the_row_cannot_use_is_refused(text, words):
    with pytest.raises(UnsupportedConfiguration, match=words):
        parse_config(text)


# -- pairs, the columns and the JSON, on made-up rows -----------------------------------------------------------------
def _rows(text, kv, ids):
    configs = parse_configs(text)
    rows = [
        ConfigResult(index=i, config=c.label, strategy=c.strategy, status="ok", kv=form, token_ids=t)
        for i, (c, form, t) in enumerate(zip(configs, kv, ids))
    ]
    return configs, rows


def _report(rows):
    return BenchReport(spec={}, machine={}, model="m", device="cpu", started_at="", results=rows)


def test_a_q8_row_beside_the_same_row_in_bf16_shows_its_agreement():
    configs, rows = _rows(
        "fast:q8+kv=q8,kv:q8,fast:q4+kv=q8,fast:q8",  # the plain fast:q8 ran in the run's form, bf16
        ["q8", None, "q8", "bf16"],
        [[[1, 2, 3, 4]], [[1, 2, 3, 4]], [[1, 2, 3, 4]], [[1, 2, 0, 4]]],
    )
    assert pairs(rows, configs) == {0: 3}  # fast:q4+kv=q8 has no bf16 counterpart; kv:q8 has no KV form
    compare(rows, configs)
    q8, kv, q4, ref = rows
    assert (q8.kv_reference, q8.kv_agreement, q8.kv_first_diff, q8.kv_compared_tokens) == ("fast:q8", 0.75, 2, 4)
    for r in (kv, q4, ref):
        assert r.kv_agreement is None and r.kv_first_diff is None and r.kv_ppl_change is None
    q8.kv_ppl_change, q8.kv_forced_agreement = 0.0031, 0.979
    headers, cells = table_rows(_report(rows))
    assert KV_COLUMNS <= set(headers)
    col = {h: j for j, h in enumerate(headers)}
    assert cells[0][col["q8 KV agrees"]] == "next token 97.9%; output 75% (first differs at token 2)"
    assert cells[0][col["q8 KV ppl"]] == "+0.31%"
    assert [c[col["KV"]] for c in cells] == ["q8", "", "q8", "bf16"]
    assert [c[col["q8 KV agrees"]] for c in cells[1:]] == ["", "", ""]  # nothing, not 0
    data = json.loads(to_json(_report(rows)))["results"]
    assert (data[0]["kv"], data[0]["kv_agreement"], data[0]["kv_first_diff"]) == ("q8", 0.75, 2)
    assert (data[0]["kv_reference"], data[0]["kv_ppl_change"], data[0]["kv_compared_tokens"]) == ("fast:q8", 0.0031, 4)
    assert data[2]["kv_agreement"] is None and data[3]["kv"] == "bf16"


def test_identical_outputs_read_identical_and_no_q8_row_hides_the_columns():
    configs, rows = _rows("fast:fp32+kv=bf16,fast:fp32+kv=q8", ["bf16", "q8"], [[[5, 6]], [[5, 6]]])
    compare(rows, configs)
    headers, cells = table_rows(_report(rows))
    assert cells[1][headers.index("q8 KV agrees")] == "100% (identical)"
    configs, rows = _rows("fast:fp32,kv:fp32", ["bf16", None], [[[5, 6]], [[5, 6]]])
    compare(rows, configs)
    headers, _ = table_rows(_report(rows))
    assert not KV_COLUMNS & set(headers) and "q8 KV" not in to_text(_report(rows))
    assert json.loads(to_json(_report(rows)))["results"][0]["kv_agreement"] is None  # the JSON always has the field


def test_a_failed_counterpart_gives_no_figure():
    configs, rows = _rows("fast:fp32+kv=bf16,fast:fp32+kv=q8", ["bf16", "q8"], [[], [[5, 6]]])
    rows[0].status = "error"
    compare(rows, configs)
    assert rows[1].kv_agreement is None and rows[1].kv_reference == "fast:fp32+kv=bf16"


def test_each_pair_is_scored_once_by_its_later_row():
    configs, rows = _rows("fast:q8+kv=q8,fast:q8+kv=q8,fast:q8+kv=bf16", ["q8", "q8", "bf16"], [[[1]], [[1]], [[1]]])
    rows[2].status = "pending"  # not run yet: no pair is complete
    assert completed_pairs(rows, configs, 0) == completed_pairs(rows, configs, 1) == []
    rows[2].status = "ok"  # the bf16 row, last, completes both
    assert [(a.index, b.index) for a, b in completed_pairs(rows, configs, 2)] == [(0, 2), (1, 2)]


# -- a real run: redline bench --json on a tiny model ----------------------------------------------------------------
def test_bench_json_carries_a_q8_rows_quality_and_the_run_keeps_its_kv_form(tiny_model_dir, capsys):
    from redline.app.cli import main

    rc = main(
        [
            "bench",
            "--model",
            str(tiny_model_dir),
            "--kv",
            "q8",  # the run's form: the first row, which names none, keeps its KV cache in 8 bits
            "--configs",
            "fast:fp32,fast:fp32+kv=bf16",
            "--new-tokens",
            "6",
            "--max-prompts",
            "1",
            "--warmup",
            "0",
            "--samples",
            "1",
            "--json",
        ]
    )
    assert rc == 0
    q8, bf16 = json.loads(capsys.readouterr().out)["results"]
    assert q8["status"] == bf16["status"] == "ok", (q8["error"], bf16["error"])
    assert (q8["kv"], bf16["kv"]) == ("q8", "bf16")
    assert q8["kv_reference"] == "fast:fp32+kv=bf16" and q8["kv_compared_tokens"] == 6
    assert 0.0 <= q8["kv_agreement"] <= 1.0
    # Scored by the second row of the pair (the bf16 one here), under both forms, on its decoder.
    assert q8["kv_ppl_change"] is not None and abs(q8["kv_ppl_change"]) < 0.5
    assert 0.0 <= q8["kv_forced_agreement"] <= 1.0  # teacher-forced on the bf16 row's replies, in the same pass
    assert bf16["kv_agreement"] is None and bf16["kv_ppl_change"] is None
    assert not bf16["reused_model"]  # another KV form: the model was loaded again, its decoder built in bf16


def test_the_lab_gives_the_engine_its_kv_form_back(tiny_model_dir):
    from redline.inference.bench.lab import BenchSpec, run_bench
    from redline.inference.bench.prompts import prompt_set_from_dict
    from redline.inference.bench.results import BenchRow
    from redline.inference.engine import Engine
    from redline.inference.precision import PrecisionSpec

    engine = Engine("cpu")
    engine.load(str(tiny_model_dir), PrecisionSpec("fp32"))  # the chat's model, its decoder to be built in bf16
    prompts = prompt_set_from_dict({"name": "one", "prompts": ["Paris is the capital of France."]})
    configs = parse_configs("fast:fp32+kv=bf16,fast:fp32+kv=q8,fast:fp32+kv=q8+compile=0")
    spec = BenchSpec(str(tiny_model_dir), configs, prompts, new_tokens=4, warmup=0, samples=1)
    forms = []  # the decoder's form as each row ends: scoring the pair swaps its pool and puts it back
    report = run_bench(
        engine, spec, lambda ev: forms.append(engine.target.kv_form()) if isinstance(ev, BenchRow) else None, None, True
    )
    bf16, q8, lone = report.results
    assert forms == ["bf16", "q8", "q8"] and q8.kv_ppl_change is not None and q8.kv_agreement is not None
    assert lone.kv == "q8" and lone.kv_agreement is None and lone.kv_ppl_change is None  # no counterpart: nothing
    assert engine.limits.kv == "bf16" and engine.target.kv_form() in (None, "bf16")  # the chat's model as it was


# -- the panel -------------------------------------------------------------------------------------------------------
def test_the_panel_shows_the_quality_column_only_beside_a_q8_row(qtbot):
    from redline.ui.speedlab.charts import Charts
    from redline.ui.speedlab.results import ResultsView

    charts = Charts()
    qtbot.addWidget(charts)
    view = ResultsView(charts)
    configs, rows = _rows("fast:fp32+kv=bf16,fast:fp32+kv=q8", ["bf16", "q8"], [[[5, 6, 7, 8]], [[5, 6, 7, 9]]])
    compare(rows, configs)
    view.show_reports([_report(rows)])
    table = view.table
    headers = [table.horizontalHeaderItem(j).text() for j in range(table.columnCount())]
    agrees = headers.index("q8 KV agrees")
    assert not table.isColumnHidden(agrees) and not table.isColumnHidden(headers.index("q8 KV ppl"))
    shown = {table.item(i, 0).text(): table.item(i, agrees).text() for i in range(table.rowCount())}  # sortable
    assert shown == {"fast:fp32+kv=q8": "75% (first differs at token 3)", "fast:fp32+kv=bf16": ""}
    configs, rows = _rows("fast:fp32,kv:fp32", ["bf16", None], [[[5]], [[5]]])
    view.show_reports([_report(rows)])
    assert all(table.isColumnHidden(headers.index(h)) for h in KV_COLUMNS)


def test_the_configuration_table_sets_a_fast_rows_kv_form(qtbot):
    from redline.ui.speedlab.configs import KV, STRATEGY, ConfigEditor

    editor = ConfigEditor("fast:q8+kv=q8,kv:q8")
    qtbot.addWidget(editor)
    cell = editor.table.cellWidget
    assert cell(0, KV).currentData() == "q8" and cell(0, KV).isEnabled()
    assert not cell(1, KV).isEnabled()  # transformers' cache: no KV form to choose
    cell(0, KV).setCurrentIndex(1)  # bf16
    assert editor.configs()[0].kv == "bf16" and editor.text_edit.text() == "fast:q8+kv=bf16,kv:q8"
    cell(0, STRATEGY).setCurrentText("kv")  # a row that leaves the fast path leaves its KV form
    assert editor.configs()[0].kv is None and "+kv=" not in editor.text_edit.text()


def test_the_kv_forms_set_pairs_each_q8_row_with_its_bf16_row():
    """The ready-made set (the panel's "KV cache: 16-bit against 8-bit", ``redline bench --set kv-forms``): each
    q8 row finds its counterpart, so the quality columns fill; on CUDA the pair is in bf16 weights."""
    from types import SimpleNamespace

    from redline.app.cli import build_parser
    from redline.inference.bench.sets import kv_forms

    rows = kv_forms("cpu")
    ran = [SimpleNamespace(index=i, kv=c.kv) for i, c in enumerate(rows)]
    assert pairs(ran, rows) == {1: 0, 3: 2}
    assert [(c.precision, c.kv) for c in kv_forms("cuda")] == [("bf16", "bf16"), ("bf16", "q8")]
    args = build_parser().parse_args(["bench", "--set", "kv-forms"])
    assert args.ready_set == "kv-forms"
