"""`redline chat` with a reasoning model: the thinking dimmed on a terminal (on stderr when stdout is not one), hidden
with --hide-thinking, apart in --json; --thinking off reaching the model's template. The model is a tiny random one
with a Qwen3-style template made to write a scripted reply (the engine service's submit is wrapped in this process)."""

from __future__ import annotations

import io
import json

import pytest
from conftest import build_tiny_model
from reasoning_helpers import Script, thinking_tokenizer

from redline.app import cli
from redline.app.cli_chat import ReplyPrinter
from redline.inference import EngineService, TokenEvent

REPLY = "<think>\nI add 2 and 2.\n</think>\n\nIt is 4."


class Tty(io.StringIO):
    def isatty(self):
        return True


def events(*parts):
    return [TokenEvent(i, i, text, 0.0, reasoning=thought) for i, (thought, text) in enumerate(parts)]


def test_printer_on_a_terminal_dims_the_thinking(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    out, err = Tty(), io.StringIO()
    printer = ReplyPrinter(out, err)
    for e in events(("I add", ""), (" 2 and 2.", ""), ("", "It is"), ("", " 4.")):
        printer(e)
    printer.end()
    assert out.getvalue() == "\x1b[2mI add 2 and 2.\x1b[0m\n\nIt is 4."
    assert err.getvalue() == ""


def test_printer_into_a_pipe_keeps_the_answer_alone_on_stdout():
    out, err = io.StringIO(), io.StringIO()
    printer = ReplyPrinter(out, err)
    for e in events(("I add 2 and 2.", ""), ("", "It is 4.")):
        printer(e)
    printer.end()
    assert (out.getvalue(), err.getvalue()) == ("It is 4.", "I add 2 and 2.\n\n")


def test_printer_hides_the_thinking_and_resets_a_cut_off_one():
    out, err = Tty(), io.StringIO()
    hidden = ReplyPrinter(out, err, hide=True)
    for e in events(("I add 2 and 2.", ""), ("", "It is 4.")):
        hidden(e)
    assert out.getvalue() == "It is 4."
    cut = Tty()
    printer = ReplyPrinter(cut, err)
    printer(events(("Still thinking", ""))[0])
    printer.end()
    assert cut.getvalue().endswith("\x1b[0m\n\n")


@pytest.fixture(scope="module")
def thinker(tmp_path_factory, starter_dir):
    tok = thinking_tokenizer(starter_dir)
    return build_tiny_model(tmp_path_factory.mktemp("cli") / "thinker", tokenizer=tok, layers=1, hidden=32), tok


@pytest.fixture
def scripted(thinker, monkeypatch):
    folder, tok = thinker
    submit = EngineService.submit
    script = {"text": REPLY}

    def wrapped(self, request):
        ids = tok(script["text"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        request.logits_processor = Script(ids, request.logits_processor)
        return submit(self, request)

    monkeypatch.setattr(EngineService, "submit", wrapped)
    return folder, script


def chat(folder, *extra):
    args = ["chat", "What is 2 + 2?", "--model", str(folder), "--precision", "fp32", "--strategy", "kv"]
    return cli.main([*args, *extra])


def test_chat_prints_the_answer_and_the_thinking_apart(scripted, capsys):
    folder, _ = scripted
    assert chat(folder, "--temperature", "0") == 0
    out, err = capsys.readouterr()
    assert out.strip() == "It is 4."
    assert "I add 2 and 2." in err and "think>" not in out + err
    assert "thinking," in err and "answer)" in err  # the summary counts them apart


def test_chat_json_carries_the_thinking_apart_and_thinking_off_reaches_the_template(scripted, capsys):
    folder, script = scripted
    assert chat(folder, "--json", "--temperature", "0") == 0
    on = json.loads(capsys.readouterr().out)
    assert (on["reasoning"], on["text"]) == ("I add 2 and 2.", "It is 4.")
    assert on["reasoning_tokens"] + on["answer_tokens"] == on["new_tokens"]
    script["text"] = "It is 4."
    assert chat(folder, "--json", "--temperature", "0", "--thinking", "off") == 0
    off = json.loads(capsys.readouterr().out)
    assert (off["reasoning"], off["text"], off["reasoning_tokens"]) == ("", "It is 4.", 0)
    assert off["prompt_tokens"] > on["prompt_tokens"]  # the closed, empty thinking block the template added
