"""Attached documents through the engine: placed by the one prompt builder (whole before the question, or the
retrieved excerpts of a document too large, cited in the result), read once (the next question about the same
document reuses its pages, in memory and after a restart), their cost said before sending, and the same through the
HTTP server (chat's file and image_url parts, the Responses API's input_file) and ``redline chat --attach``."""

from __future__ import annotations

import base64
import io
import json
import random
import subprocess
import sys

import openai
import pytest
from transformers import AutoTokenizer

from redline.inference import (
    AttachmentCost,
    DecodeOptions,
    Engine,
    EngineService,
    GenerationRequest,
    SamplingSettings,
    attachment_cost_job,
    read_attachment,
    read_attachment_bytes,
)
from redline.inference.generation.attached import document_room
from redline.inference.generation.request import prepare
from redline.inference.precision import parse_precision
from tests.test_server import post, start, stop

TIMEOUT = 120
FACT = "The bridge at Calvera was rebuilt in 1874 by the engineer Ottilie Marsh."
QUESTION = "Who rebuilt the bridge at Calvera?"
WORDS = (
    "river stone market winter harvest lantern orchard valley copper meadow tower canal pepper wool salt ferry "
    "garden mill quarry chapel barley clock harbor"
).split()


def filler(rng: random.Random, sentences: int) -> str:
    return " ".join(
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 12))).capitalize() + "." for _ in range(sentences)
    )


def write_pdf(path, pages: int, fact_page: int, sentences: int = 12, seed: int = 5):
    """A PDF of ``pages`` pages of seeded filler, ``FACT`` in the middle of page ``fact_page``."""
    from fpdf import FPDF

    rng = random.Random(seed)
    pdf = FPDF()
    pdf.set_font("Helvetica", size=10)
    for n in range(1, pages + 1):
        pdf.add_page()
        text = filler(rng, sentences)
        if n == fact_page:
            half = len(text) // 2
            cut = text.index(". ", half) + 2
            text = text[:cut] + FACT + " " + text[cut:]
        pdf.multi_cell(0, 5, text)
    pdf.output(str(path))
    return path


def flat(text: str) -> str:
    """Text with its line breaks as spaces (a PDF's lines wrap where its page is full)."""
    return " ".join(text.split())


def ask(svc, messages, max_new=12, context=None, strategy="fast"):
    request = GenerationRequest(
        messages=messages,
        sampling=SamplingSettings(max_new_tokens=max_new, temperature=0),
        options=DecodeOptions(strategy),
        context=context,
    )
    return svc.submit(request).result(TIMEOUT)


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory):
    from conftest import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("attach") / "tiny-attach", max_positions=4096)


@pytest.fixture
def pages_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("REDLINE_KV_PAGES_DIR", str(tmp_path / "pages"))
    return tmp_path / "pages"


def service(folder) -> EngineService:
    svc = EngineService(lambda: Engine("cpu"))
    svc.load(str(folder), parse_precision("fp32")).result(TIMEOUT)
    return svc


# -- the prompt builder ---------------------------------------------------------------------------------------------
def test_a_document_that_fits_goes_whole_before_the_question(tmp_path, long_tiny):
    tok = AutoTokenizer.from_pretrained(long_tiny)
    doc = read_attachment(write_pdf(tmp_path / "town.pdf", pages=3, fact_page=2))
    prompts = []
    for question in (QUESTION, "When was it rebuilt?"):
        request = GenerationRequest(messages=[{"role": "user", "content": question, "attachments": [doc]}])
        ready = prepare(tok, 4096, request)
        assert not ready.citations and not [n for n in ready.notes if "does not fit" in n]
        text = flat(tok.decode(ready.prompt))
        assert FACT in text and text.index("town.pdf") < text.index(FACT) < text.index(question)
        prompts.append(ready.prompt)
    same = next(i for i, (a, b) in enumerate(zip(*prompts)) if a != b)
    doc_tokens = len(tok(doc.text, add_special_tokens=False)["input_ids"])
    assert same >= doc_tokens  # two questions about one document share its tokens: the prefix cache reads it once


def test_a_document_five_times_the_context_sends_the_excerpt_that_holds_the_answer(tmp_path, long_tiny):
    tok = AutoTokenizer.from_pretrained(long_tiny)
    doc = read_attachment(write_pdf(tmp_path / "annals.pdf", pages=40, fact_page=23))
    context = 1024
    assert len(tok(doc.text)["input_ids"]) > 5 * context
    request = GenerationRequest(
        messages=[{"role": "user", "content": QUESTION, "attachments": [doc]}],
        sampling=SamplingSettings(max_new_tokens=32),
    )
    ready = prepare(tok, context, request)
    assert len(ready.prompt) + ready.max_new <= context
    assert 23 in [c.page for c in ready.citations]
    assert any(FACT in flat(c.text) for c in ready.citations)
    assert any("annals.pdf" in n and "does not fit" in n for n in ready.notes)
    assert FACT in flat(tok.decode(ready.prompt))


def test_the_reply_carries_its_citations_and_a_second_question_reads_only_itself(tmp_path, long_tiny, pages_dir):
    doc = read_attachment(write_pdf(tmp_path / "annals.pdf", pages=40, fact_page=23))
    svc = service(long_tiny)
    try:
        cut = ask(svc, [{"role": "user", "content": QUESTION, "attachments": [doc]}], context=1024)
        assert cut.finish_reason in ("length", "eos") and cut.citations
        assert {"number", "name", "page", "chunk", "text"} == set(cut.citations[0])
        assert 23 in [c["page"] for c in cut.citations] and cut.citations[0]["name"] == "annals.pdf"

        short = read_attachment(write_pdf(tmp_path / "town.pdf", pages=4, fact_page=2))
        first = ask(svc, [{"role": "user", "content": QUESTION, "attachments": [short]}])
        second = ask(svc, [{"role": "user", "content": "When was it rebuilt?", "attachments": [short]}])
        assert not first.citations and first.cached_tokens < 64
        # the document's pages are reused: the second question reads its own few tokens and the last partial page
        assert second.cached_tokens >= second.prompt_tokens - 64 - 16
    finally:
        svc.shutdown()  # its pages go to disk
    svc = service(long_tiny)  # a new engine, as a new process would start: the pages come from disk
    try:
        third = ask(svc, [{"role": "user", "content": "Who was the engineer?", "attachments": [short]}])
    finally:
        svc.shutdown()
    assert third.cached_tokens >= third.prompt_tokens - 64 - 16


def test_an_image_for_a_model_that_cannot_see_is_refused_before_anything_runs(tmp_path, long_tiny):
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), "red").save(buf, "PNG")
    image = read_attachment_bytes(buf.getvalue(), "dot.png")
    svc = service(long_tiny)
    try:
        with pytest.raises(Exception, match="cannot see images"):
            ask(svc, [{"role": "user", "content": "What colour?", "attachments": [image]}])
        assert ask(svc, [{"role": "user", "content": "Still here?"}]).new_tokens > 0  # nothing else was lost
    finally:
        svc.shutdown()


# -- the chip's cost -----------------------------------------------------------------------------------------------
def test_the_cost_before_sending_counts_the_placed_tokens_and_says_what_will_not_fit(tmp_path, long_tiny):
    tok = AutoTokenizer.from_pretrained(long_tiny)
    short = read_attachment(write_pdf(tmp_path / "town.pdf", pages=2, fact_page=1))
    long = read_attachment(write_pdf(tmp_path / "annals.pdf", pages=60, fact_page=23))
    svc = service(long_tiny)
    try:
        small = svc.call(attachment_cost_job([short], 0)).result(TIMEOUT)
        big = svc.call(attachment_cost_job([long], 0)).result(TIMEOUT)
        crowded = svc.call(attachment_cost_job([short], 3900)).result(TIMEOUT)
        svc.unload().result(TIMEOUT)
        none = svc.call(attachment_cost_job([short], 0)).result(TIMEOUT)
    finally:
        svc.shutdown()
    assert isinstance(small, AttachmentCost) and none is None
    placed = len(tok(short.text, add_special_tokens=False)["input_ids"])
    assert placed <= small.tokens <= placed + 80  # the document and its markers ([page N], its name)
    assert small.fits and not small.warning and small.kv_bytes > 0 and small.ttft_s > 0
    assert f"{small.tokens:,} tokens" in small.text and "to first token" in small.text
    assert not big.fits and "excerpts" in big.warning and big.tokens <= document_room(4096, 256)
    assert not crowded.fits and "earliest turns will be left out" in crowded.warning
    # more tokens cost more KV, in proportion
    assert big.kv_bytes / big.tokens == pytest.approx(small.kv_bytes / small.tokens, rel=0.01)


# -- the HTTP server ---------------------------------------------------------------------------------------------
def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="module")
def server(long_tiny):
    service_, server_ = start(long_tiny)
    yield openai.OpenAI(base_url=server_.address, api_key="unused", max_retries=0, timeout=60), server_
    stop(service_, server_)


def test_the_server_reads_a_pdf_sent_as_a_file_part_and_refuses_what_it_cannot_read(tmp_path, server):
    client, srv = server
    pdf = write_pdf(tmp_path / "town.pdf", pages=3, fact_page=2).read_bytes()
    part = {"type": "file", "file": {"filename": "town.pdf", "file_data": data_url(pdf, "application/pdf")}}
    messages = [{"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}]
    plain = [{"role": "user", "content": QUESTION}]
    with_doc = client.chat.completions.create(model="tiny-attach", messages=messages, max_tokens=4, temperature=0)
    without = client.chat.completions.create(model="tiny-attach", messages=plain, max_tokens=4, temperature=0)
    assert with_doc.usage.prompt_tokens > without.usage.prompt_tokens + 200

    r = client.responses.create(
        model="tiny-attach",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_file", "filename": "town.pdf", "file_data": data_url(pdf, "application/pdf")},
                    {"type": "input_text", "text": QUESTION},
                ],
            }
        ],
        max_output_tokens=4,
        temperature=0,
    )
    assert r.usage.input_tokens == with_doc.usage.prompt_tokens

    def refused(content, *words):
        body = {"model": "tiny-attach", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
        response = post(srv, "/chat/completions", body)
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        for word in words:
            assert word in message, message
        return response.json()["error"]

    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), "red").save(buf, "PNG")
    png = {"type": "image_url", "image_url": {"url": data_url(buf.getvalue(), "image/png")}}
    refused([png, {"type": "text", "text": "What colour?"}], "cannot see images")
    remote = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    assert refused([remote], "not fetched")["param"] == "messages[0].content[0].image_url.url"
    refused([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}], "not valid base64")
    broken = {"type": "file", "file": {"filename": "bad.pdf", "file_data": data_url(pdf[:300], "application/pdf")}}
    refused([broken], "bad.pdf", "PDF")
    refused([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}], "not input_audio")
    system_image = {"model": "tiny-attach", "messages": [{"role": "system", "content": [png]}, *plain], "max_tokens": 2}
    assert "only user messages" in post(srv, "/chat/completions", system_image).json()["error"]["message"]
    assert client.chat.completions.create(model="tiny-attach", messages=plain, max_tokens=2).choices  # still serving


# -- redline chat --attach -----------------------------------------------------------------------------------------
def chat(*args, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "redline", "chat", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_chat_attach_answers_with_the_document_and_a_bad_file_fails_before_loading(tmp_path, long_tiny):
    pdf = write_pdf(tmp_path / "town.pdf", pages=3, fact_page=2)
    out = chat(QUESTION, "--attach", str(pdf), "--model", str(long_tiny), "--json", "--max-new-tokens", "4")
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert record["attachments"] == [
        {"name": "town.pdf", "kind": "pdf", "pages": 3, "sha256": read_attachment(pdf).sha256}
    ]
    assert record["prompt_tokens"] > 300
    (tmp_path / "locked.pdf").write_bytes(b"%PDF-1.4\n garbage")
    bad = chat("Hi", "--attach", str(tmp_path / "locked.pdf"), "--model", str(long_tiny))
    assert bad.returncode == 2 and "locked.pdf" in bad.stderr and "PDF" in bad.stderr
    assert "Loaded" not in bad.stderr  # refused before the model loaded
    missing = chat("Hi", "--attach", str(tmp_path / "nowhere.txt"), "--model", str(long_tiny))
    assert missing.returncode == 2 and "nowhere.txt does not exist" in missing.stderr


@pytest.mark.starter
def test_the_starter_answers_from_the_middle_of_an_attached_pdf(tmp_path, starter_dir):
    pdf = write_pdf(tmp_path / "calvera.pdf", pages=5, fact_page=3, sentences=10)
    svc = EngineService(lambda: Engine("cpu"))
    try:
        svc.load(str(starter_dir), parse_precision("q8")).result(TIMEOUT)
        reply = ask(svc, [{"role": "user", "content": QUESTION, "attachments": [read_attachment(pdf)]}], 24)
    finally:
        svc.shutdown()
    assert "Marsh" in reply.text, reply.text


# -- a model on another server ---------------------------------------------------------------------------------
def test_a_remote_model_gets_the_document_in_its_text(tmp_path, long_tiny, server):
    """The window's message with a document, to a model on another server (here Redline's own, serving the same
    model): the document is placed in the text the server receives, as the local prompt builder places it."""
    from redline.inference.attachments.wire import content, data_url

    _, srv = server
    doc = read_attachment(write_pdf(tmp_path / "town.pdf", pages=3, fact_page=2))
    placed = content({"role": "user", "content": QUESTION, "attachments": [doc]}, 4096)
    assert isinstance(placed, str) and flat(placed).index("town.pdf") < flat(placed).index(FACT) < len(flat(placed))
    assert placed.endswith(QUESTION)
    client = EngineService(lambda: Engine("cpu"))
    try:
        client.call(lambda engine, report: engine.load(srv.address, None), "a connection").result(60)
        remote = ask(client, [{"role": "user", "content": QUESTION, "attachments": [doc]}], 4, strategy="auto")
        local = ask(client, [{"role": "user", "content": QUESTION}], 4, strategy="auto")
    finally:
        client.shutdown()
    assert remote.error is None and remote.prompt_tokens > local.prompt_tokens + 200

    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), "red").save(buf, "PNG")
    image = read_attachment_bytes(buf.getvalue(), "dot.png")
    parts = content({"role": "user", "content": "What colour?", "attachments": [image]}, 4096)
    assert parts == [
        {"type": "text", "text": "What colour?"},
        {"type": "image_url", "image_url": {"url": data_url(image)}},
    ]
    assert data_url(image).startswith("data:image/png;base64,")


def test_the_chip_says_before_sending_that_a_text_model_cannot_see_an_image(tmp_path, long_tiny):
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGB", (64, 32), "blue").save(buf, "PNG")
    image = read_attachment_bytes(buf.getvalue(), "photo.png")
    doc = read_attachment(write_pdf(tmp_path / "town.pdf", pages=2, fact_page=1))
    svc = service(long_tiny)
    try:
        alone = svc.call(attachment_cost_job([image], 0)).result(TIMEOUT)
        both = svc.call(attachment_cost_job([doc, image], 0)).result(TIMEOUT)
    finally:
        svc.shutdown()
    assert not alone.fits and "cannot see images" in alone.warning and alone.text == "not read by this model"
    assert not both.fits and "cannot see images" in both.warning and both.text.endswith("to first token")


def test_a_remote_image_is_fetched_only_where_the_user_allowed_it(long_tiny):
    """--allow-remote-media: an image_url's http URL is fetched (bounded), read as an inline image is; without it, the
    same request is refused naming the part. Here the image reaches the prompt builder, which refuses it for this
    text-only model: it was fetched and read. A URL that answers 404 is one sentence."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), "red").save(buf, "PNG")
    png = buf.getvalue()

    class Images(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path != "/dot.png":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

        def log_message(self, *args):
            pass

    images = ThreadingHTTPServer(("127.0.0.1", 0), Images)
    thread = threading.Thread(target=images.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{images.server_address[1]}"
    service_, server_ = start(long_tiny, fetch_remote_media=True)
    try:

        def ask_with(url):
            content = [{"type": "text", "text": "What colour?"}, {"type": "image_url", "image_url": {"url": url}}]
            body = {"model": "tiny-attach", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
            return post(server_, "/chat/completions", body)

        fetched = ask_with(base + "/dot.png")
        assert fetched.status_code == 400 and "cannot see images" in fetched.json()["error"]["message"]
        missing = ask_with(base + "/none.png")
        assert missing.status_code == 400 and "answered 404" in missing.json()["error"]["message"]
    finally:
        stop(service_, server_)
        images.shutdown()
        thread.join(10)
