"""Tools a model may call (issue 51): mcp.json read with one sentence for what is wrong in it; MCP servers (a tiny one
written here with the SDK's server side, tests/mcp_servers/echo_server.py) started as subprocesses, listed, called,
timed out, crashed and stopped, each wait bounded; Streamable HTTP to the same server run in-process by uvicorn; the
built-in calculator and file reader; the approval policy; the tool loop with a scripted model; and `redline chat`
end to end on a tiny random model forced to call a tool through the call grammar. No network: every server is a
child process or a thread of this test, on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import io
import json
import socket
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import build_tiny_model, build_tokenizer

from redline.app import cli
from redline.app.cli_tools import ask_on_terminal
from redline.inference import EngineService, GenerationResult
from redline.inference.tools import (
    ALLOW,
    ALWAYS,
    ASK,
    DENY,
    NEVER,
    ApprovalPolicy,
    BuiltinTools,
    CalculationError,
    McpConfigError,
    McpManager,
    PendingCall,
    ServerSpec,
    ToolRegistry,
    calculate,
    definition_tokens,
    parse_mcp_config,
    qualified_name,
    read_mcp_config,
    run_tool_loop,
)
from redline.inference.tools.generate import ServiceGenerator, fallback_messages

ECHO = Path(__file__).parent / "mcp_servers" / "echo_server.py"
PY = sys.executable


def echo(name: str = "echo", *extra: str) -> ServerSpec:
    return ServerSpec(name, command=PY, args=(str(ECHO), *extra))


# -- mcp.json ----------------------------------------------------------------------------------------------------
def test_a_good_mcp_json_lists_stdio_and_http_servers(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "globalShortcut": "Ctrl+Space",  # Claude Desktop keeps its other settings beside the servers
                "mcpServers": {
                    "files": {"command": "npx", "args": ["-y", "server-fs", "/tmp", 3], "env": {"DEBUG": 1}},
                    "web": {"url": "http://127.0.0.1:8931/mcp", "headers": {"Authorization": "Bearer x"}},
                    "typed": {"type": "http", "url": "https://example.invalid/mcp"},
                    "off": {"command": "nothing", "disabled": True},
                },
            }
        )
    )
    files, web, typed = read_mcp_config(path)
    assert (files.name, files.transport, files.command, files.args, files.env) == (
        "files",
        "stdio",
        "npx",
        ("-y", "server-fs", "/tmp", "3"),
        {"DEBUG": "1"},
    )
    assert (web.transport, web.url, web.headers) == ("http", "http://127.0.0.1:8931/mcp", {"Authorization": "Bearer x"})
    assert typed.transport == "http"
    assert read_mcp_config(tmp_path / "none.json", missing_ok=True) == []
    assert parse_mcp_config("  ") == []


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"mcpServers": {\n  "a": {"command": "x",}\n}}', r"mcp.json is not valid JSON: .* at line 2, column 24\."),
        ("[1, 2]", r"mcp.json holds a JSON array, not an object"),
        ('{"servers": {}}', r'has no "mcpServers" object\. Rename "servers" to "mcpServers"'),
        ('{"mcpServers": []}', r'"mcpServers" in mcp.json is a JSON array'),
        ('{"mcpServers": {"a": "npx"}}', r'The server "a" in mcp.json is a JSON string, not an object'),
        (
            '{"mcpServers": {"a": {"command": "x", "agrs": []}}}',
            r'The server "a" in mcp.json has an unknown key "agrs"',
        ),
        ('{"mcpServers": {"a": {}}}', r'has neither "command" nor "url"'),
        ('{"mcpServers": {"a": {"command": "x", "url": "http://h/mcp"}}}', r'has both "command" and "url"'),
        ('{"mcpServers": {"a": {"url": "ftp://h/mcp"}}}', r'"url" of the server "a" .* not an http'),
        ('{"mcpServers": {"a": {"command": "x", "args": "-y"}}}', r'"args" of the server "a" .* not a list'),
        ('{"mcpServers": {"a": {"command": "x", "env": {"K": null}}}}', r'"env" of the server "a" .* gives "K" a null'),
        ('{"mcpServers": {"a": {"url": "http://h/sse", "type": "sse"}}}', r"old SSE transport"),
        ('{"mcpServers": {"a": {"url": "http://h/mcp", "args": []}}}', r'has a "url" and "args"'),
    ],
)
def test_a_malformed_mcp_json_is_one_sentence_naming_the_file(text, expected):
    with pytest.raises(McpConfigError, match=expected) as caught:
        parse_mcp_config(text, "mcp.json")
    assert "Traceback" not in str(caught.value) and str(caught.value).count("\n") == 0


def test_a_missing_or_unreadable_file_names_it(tmp_path):
    with pytest.raises(McpConfigError, match=r"none\.json does not exist"):
        read_mcp_config(tmp_path / "none.json")
    with pytest.raises(McpConfigError, match="is a folder"):
        read_mcp_config(tmp_path)


# -- MCP servers over stdio --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def manager():
    m = McpManager([echo()], start_timeout_s=30, call_timeout_s=20)
    yield m
    m.close()


def test_a_stdio_servers_tools_are_listed_and_called(manager):
    tools = {t.name: t for t in manager.tools("echo")}
    assert {"add", "shout", "hang", "crash", "fail", "pid"} <= set(tools)
    assert tools["add"].description.startswith("Add two whole numbers")
    assert tools["add"].input_schema["properties"]["a"]["maximum"] == 999
    assert manager.tools("echo") is manager.tools("echo") or manager.tools("echo") == list(tools.values())  # cached
    added = manager.call("echo", "add", {"a": 2, "b": 3})
    assert (added.text, added.is_error) == ("5", False) and added.ms > 0
    failed = manager.call("echo", "fail", {})
    assert failed.is_error and "fail" in failed.text


def test_a_call_that_hangs_times_out_with_a_sentence_and_the_server_answers_the_next(manager):
    start = time.monotonic()
    hung = manager.call("echo", "hang", {}, timeout_s=1.0)
    assert time.monotonic() - start < 8
    assert hung.is_error
    assert hung.text == "The MCP server 'echo' did not answer the call to hang within 1 s; the call was stopped."
    assert manager.call("echo", "shout", {"text": "still here"}).text == "STILL HERE"


def test_a_server_that_dies_mid_call_is_that_calls_error_and_starts_again(manager):
    manager.tools("echo")
    before = manager.pid("echo")
    crashed = manager.call("echo", "crash", {}, timeout_s=10)
    assert crashed.is_error and "stopped during the call to crash" in crashed.text
    assert manager.call("echo", "add", {"a": 1, "b": 1}).text == "2"  # started again
    assert manager.pid("echo") not in (None, before)


def test_servers_that_cannot_start_are_one_sentence_each_and_block_nobody():
    m = McpManager(
        [
            echo(),
            ServerSpec("gone", command="redline-no-such-command"),
            echo("dies", "--crash-at-start"),
            echo("stuck", "--hang-at-start"),
        ],
        start_timeout_s=8,  # room for the echo server's own start on a busy machine
    )
    try:
        start = time.monotonic()
        tools, errors = m.all_tools()
        took = time.monotonic() - start
    finally:
        m.close()
    assert took < 20  # the stuck one's 8 s, the others together, not one after another
    assert {t.server for t in tools} == {"echo"}
    assert errors["gone"] == (
        "The MCP server 'gone' could not start: the command 'redline-no-such-command' was not found. "
        "Check its command in mcp.json."
    )
    assert errors["dies"].startswith("The MCP server 'dies' could not start: it exited before answering")
    assert "(it said: echo_server: refusing to start)" in errors["dies"]
    assert (
        errors["stuck"]
        == "The MCP server 'stuck' could not start: no answer within 8 s. Check its command in mcp.json."
    )


def test_a_call_to_a_server_that_cannot_start_is_an_error_result():
    with McpManager([ServerSpec("gone", command="redline-no-such-command")]) as m:
        result = m.call("gone", "anything", {})
    assert result.is_error and "could not start" in result.text


def test_close_stops_every_server_process():
    m = McpManager([echo("one"), echo("two")], start_timeout_s=30)
    m.all_tools()
    pids = [m.pid("one"), m.pid("two")]
    assert all(pids) and all(psutil.pid_exists(p) for p in pids)
    served = [int(m.call(n, "pid", {}).text) for n in ("one", "two")]
    assert served == pids  # the processes noted are the servers themselves
    start = time.monotonic()
    m.close()
    assert time.monotonic() - start < 15
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(Exception, match="stopped"):
        m.tools("one")


# -- Streamable HTTP ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def http_server():
    """The echo server's app (``MCPServer.streamable_http_app``) served by uvicorn on a free port, in a thread."""
    import uvicorn

    spec = importlib.util.spec_from_file_location("echo_server_http", ECHO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(module.server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="test-mcp-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}/mcp"
    server.should_exit = True
    thread.join(15)


def test_a_streamable_http_server_is_listed_and_called(http_server):
    with McpManager([ServerSpec("web", url=http_server, headers={"X-Test": "1"})], call_timeout_s=10) as m:
        assert "add" in {t.name for t in m.tools("web")}
        assert m.call("web", "add", {"a": 40, "b": 2}).text == "42"
        hung = m.call("web", "hang", {}, timeout_s=1.0)
        assert hung.is_error and "within 1 s" in hung.text
        assert m.call("web", "shout", {"text": "ok"}).text == "OK"


def test_an_address_where_nothing_answers_is_one_sentence():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with McpManager([ServerSpec("nothing", url=f"http://127.0.0.1:{port}/mcp")], start_timeout_s=10) as m:
        tools, errors = m.all_tools()
    assert tools == [] and errors["nothing"].startswith("The MCP server 'nothing' could not start: nothing answered")
    assert errors["nothing"].endswith("Check its address in mcp.json.")


# -- built-in tools ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "expression, value",
    [
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("0.1 + 0.2", "0.3"),
        ("-3 ** 2", "-9"),
        ("7 // 2 + 7 % 2", "4"),
        ("2 ^ 10", "1024"),
        ("sqrt(16) + log(e)", "5"),
        ("round(sin(pi / 6), 3)", "0.5"),
        ("max(1, 5, 3)", "5"),
        ("factorial(20)", "2432902008176640000"),
    ],
)
def test_calculate_answers(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression, why",
    [
        ("__import__('os').system('echo hi')", "calculate cannot call"),
        ("__import__('os')", "cannot call '__import__'"),
        ("(1).__class__", "is none of those"),
        ("open('x')", "cannot call 'open'"),
        ("x + 1", "does not know 'x'"),
        ("'a' * 3", "numbers only"),
        ("1 / 0", "divides by zero"),
        ("9 ** 9 ** 9", "too large"),
        ("2 ** 100000", "too large"),
        ("10 ** 1e7", "too large"),
        ("factorial(100000)", "too large"),
        ("exp(1000)", "too large"),
        ("[1, 2]", "is none of those"),
        ("lambda: 1", "is none of those"),
        ("1 +", "not an arithmetic expression"),
        ("(" * 200 + "1" + ")" * 200, ""),
    ],
)
def test_calculate_refuses_with_a_sentence_and_never_hangs(expression, why):
    start = time.monotonic()
    try:
        calculate(expression)
    except CalculationError as exc:
        assert why in str(exc)
    else:
        assert why == ""  # deep parentheses are allowed where Python's parser takes them
    assert time.monotonic() - start < 1.0


def test_read_file_reads_only_what_the_user_allowed(tmp_path):
    allowed = tmp_path / "notes.txt"
    allowed.write_text("alpha beta gamma\n" * 3)
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "inside.md").write_text("# Inside\nhello")
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    tools = BuiltinTools(allowed=[allowed, folder], calculator=False)
    assert tools.names == ["read_file"]
    assert tools.call("read_file", {"path": str(allowed)}).text.startswith("alpha beta gamma")
    assert tools.call("read_file", {"path": "notes.txt"}).text.startswith("alpha")  # its name alone
    assert "hello" in tools.call("read_file", {"path": "inside.md"}).text  # relative to an allowed folder
    for outside in (str(secret), str(folder / ".." / "secret.txt"), "../secret.txt", "/etc/passwd"):
        refused = tools.call("read_file", {"path": outside})
        assert refused.is_error and "is not among the files the user allowed" in refused.text, outside
    # A bare name is looked for in the allowed folders (and among the allowed files) only.
    assert tools.call("read_file", {"path": "secret.txt"}).text == "secret.txt does not exist."
    link = folder / "link.txt"
    link.symlink_to(secret)
    assert tools.call("read_file", {"path": str(link)}).is_error  # a link out of the folder is outside it
    assert tools.call("calculate", {"expression": "1+1"}).is_error  # not offered here


def test_read_file_is_size_capped_and_reads_on(tmp_path):
    long = tmp_path / "long.txt"
    long.write_text("x" * 2500)
    tools = BuiltinTools(allowed=[long], max_chars=1000)
    first = tools.call("read_file", {"path": str(long)}).text
    assert first.startswith("x" * 1000) and "call read_file with offset 1000" in first
    last = tools.call("read_file", {"path": str(long), "offset": 2000}).text
    assert last == "x" * 500


# -- the list of tools -------------------------------------------------------------------------------------------
def test_the_registry_names_mcp_tools_by_server_and_counts_their_tokens(manager):
    registry = ToolRegistry(manager, BuiltinTools())
    assert registry.refresh() == {}
    names = registry.names
    assert names[0] == "calculate" and "echo__add" in names
    add = registry.get("add")  # its own name, where one server alone has it
    assert (add.name, add.server, add.tool) == ("echo__add", "echo", "add")
    assert add.definition()["function"]["parameters"]["additionalProperties"] is False
    assert registry.call("echo__add", {"a": 5, "b": 6}).text == "11"
    assert registry.call("nope", {}).is_error
    assert qualified_name("my server", "read.text") == "my_server__read_text"
    assert len(qualified_name("s" * 60, "t" * 60)) == 64
    tok = build_tokenizer()
    one = definition_tokens([add.definition()], tok)
    every = definition_tokens(registry.definitions(), tok)
    assert 0 < one < every and definition_tokens([], tok) == 0
    registry.enabled = {"echo__add"}
    assert registry.names == ["echo__add"]


# -- approval ----------------------------------------------------------------------------------------------------
def test_the_approval_policy_once_always_never_persisted_and_read_back(tmp_path):
    path = tmp_path / "approvals.json"
    policy = ApprovalPolicy.load(path)
    add = PendingCall("echo__add", {"a": 1}, server="echo")
    calc = PendingCall("calculate", {"expression": "1"})
    assert policy.decide(add) == ASK and policy.decide(calc) == ASK  # once: ask each time, by default
    policy.set_tool("echo__add", ALWAYS)
    policy.set_tool("calculate", NEVER)
    assert (policy.decide(add), policy.decide(calc)) == (ALLOW, DENY)
    policy.set_server("files", NEVER)
    assert policy.decide(PendingCall("files__read", {}, server="files")) == DENY
    policy.set_server("files", ALWAYS)
    assert policy.decide(PendingCall("files__read", {}, server="files")) == ALLOW
    policy.set_tool("files__read", "once")  # a tool's rule wins over its server's trust… once is the default: trust
    again = ApprovalPolicy.load(path)
    assert (again.tools, again.servers) == ({"calculate": NEVER, "echo__add": ALWAYS}, {"files": ALWAYS})
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ValueError):
        again.set_tool("x", "sometimes")


def test_the_approver_asks_and_remembers_always():
    policy = ApprovalPolicy()
    answers = iter(["yes", "no", "always"])
    asked = []

    def ask(call):
        asked.append(call.name)
        return next(answers)

    approve = policy.approver(ask)
    call = PendingCall("t", {})
    assert [approve(call), approve(call), approve(call), approve(call)] == [True, False, True, True]
    assert asked == ["t", "t", "t"] and policy.tool_rule("t") == ALWAYS


def test_the_terminal_asks_on_a_terminal_and_refuses_without_one():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    err = io.StringIO()
    call = PendingCall("echo__add", {"a": 1, "b": 2})
    assert ask_on_terminal(call, Tty("maybe\na\n"), err) == "always"
    assert err.getvalue().count('Allow echo__add({"a": 1, "b": 2})? [y]es / [n]o / [a]lways: ') == 2
    assert ask_on_terminal(call, Tty("y\n"), io.StringIO()) == "yes"
    assert ask_on_terminal(call, Tty(""), io.StringIO()) == "no"  # end of input
    note = io.StringIO()
    assert ask_on_terminal(call, io.StringIO("y\n"), note) == "no"
    assert "stdin is not a terminal" in note.getvalue() and "--allow-tool echo__add" in note.getvalue()


# -- the loop ----------------------------------------------------------------------------------------------------
def reply(text: str = "", prompt: int = 10, finish: str = "eos", tool_calls=None) -> GenerationResult:
    result = GenerationResult(text, [], prompt, 5, finish, "kv", "fp32")
    result.tool_calls = tool_calls or []
    return result


def hermes(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class Script:
    """A generate function that replies from a list and keeps each message list it was given."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.seen: list[list[dict]] = []

    def __call__(self, messages, round_):
        self.seen.append([dict(m) for m in messages])
        return self.replies[min(round_, len(self.replies) - 1)]


USER = [{"role": "user", "content": "What is 6 times 7?"}]


def test_the_loop_runs_an_allowed_call_and_feeds_its_result_back():
    script = Script(reply("Let me work it out.\n" + hermes("calculate", expression="6*7")), reply("It is 42."))
    asked = []
    out = run_tool_loop(script, USER, ToolRegistry(builtins=BuiltinTools()), lambda c: asked.append(c) or True)
    assert out.stopped is None and out.answer == "It is 42." and len(out.results) == 2
    (call,) = out.calls
    assert (call.name, call.arguments, call.approved, call.ran, call.result) == (
        "calculate",
        {"expression": "6*7"},
        True,
        True,
        "42",
    )
    assert asked[0].shown() == 'calculate({"expression": "6*7"})'
    assistant, tool, final = out.messages
    assert assistant["content"] == "Let me work it out."
    assert assistant["tool_calls"][0]["function"] == {"name": "calculate", "arguments": '{"expression": "6*7"}'}
    assert tool == {
        "role": "tool",
        "tool_call_id": assistant["tool_calls"][0]["id"],
        "name": "calculate",
        "content": "42",
    }
    assert final == {"role": "assistant", "content": "It is 42."}
    assert script.seen[1][-1]["content"] == "42" and script.seen[0] == USER  # the result reached the second reply
    assert USER == [{"role": "user", "content": "What is 6 times 7?"}]  # not changed


def test_a_refused_call_tells_the_model_so():
    script = Script(reply(hermes("calculate", expression="1+1")), reply("As you wish."))
    out = run_tool_loop(script, USER, ToolRegistry(builtins=BuiltinTools()), lambda c: False)
    (call,) = out.calls
    assert (call.approved, call.ran) == (False, False)
    assert script.seen[1][-1]["content"] == "The user did not allow this call to calculate; it did not run."


def test_unknown_tools_and_bad_arguments_are_results_without_asking():
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "nope", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "calculate", "arguments": "[1, 2]"}},
    ]
    script = Script(reply(tool_calls=calls), reply("ok"))
    out = run_tool_loop(script, USER, ToolRegistry(builtins=BuiltinTools()), lambda c: pytest.fail("asked"))
    unknown, bad = out.calls
    assert unknown.is_error and unknown.result == "There is no tool named 'nope'; the tools are: calculate."
    assert (
        bad.is_error and bad.result == "The arguments of this call to calculate are not a JSON object; it did not run."
    )
    assert out.messages[0]["tool_calls"][1]["function"]["arguments"] == "{}"  # the transcript stays valid JSON
    assert out.answer == "ok"


def test_text_held_back_as_a_possible_call_is_released_as_text_not_as_a_second_token():
    """The start of a call (``<tool``) is held back while it streams; when the reply ends without a call it goes
    out as the engine's own last delta does: token id -1, the next index (the window counts tokens and their times
    from the others)."""
    from redline.inference import FinishedEvent, TokenEvent

    class Handle:
        def events(self):
            yield TokenEvent(0, 5, "Hello ", 0.1)
            yield TokenEvent(1, 6, "<tool", 0.2)
            yield FinishedEvent(self.result())

        def result(self):
            return reply("Hello <tool")

    class Service:
        def submit(self, request):
            return Handle()

    calculate_tool = BuiltinTools().definitions()[0]
    seen = []
    gen = ServiceGenerator(Service(), [calculate_tool], lambda m: None, on_event=seen.append)
    gen._run(None, [calculate_tool], forced=False)
    assert [(e.index, e.token_id, e.text) for e in seen] == [(0, 5, "Hello"), (2, -1, " <tool")]


def test_a_servers_tool_calls_come_apart_from_the_text():
    calls = [{"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "2**5"}'}}]
    script = Script(reply("", tool_calls=calls), reply("32."))
    out = run_tool_loop(script, USER, ToolRegistry(builtins=BuiltinTools()), lambda c: True)
    assert out.calls[0].result == "32" and out.messages[1]["tool_call_id"] == "c1"


def test_the_loop_stops_at_its_round_limit_with_every_call_answered():
    script = Script(reply(hermes("calculate", expression="1+1")))  # calls for ever
    out = run_tool_loop(script, USER, ToolRegistry(builtins=BuiltinTools()), lambda c: True, max_rounds=3)
    assert out.stopped == "max_rounds" and len(out.results) == 3
    assert [c.ran for c in out.calls] == [True, True, False]
    assert out.messages[-1]["content"] == "Not run: the limit of 3 rounds of tool calls was reached."
    assert sum(m["role"] == "tool" for m in out.messages) == sum(len(m.get("tool_calls", [])) for m in out.messages)


def test_the_loop_stops_when_cancelled_between_steps():
    stop = {"now": False}
    two = reply(hermes("calculate", expression="1") + "\n" + hermes("calculate", expression="2"))

    def approve(call):
        stop["now"] = True  # the user pressed Stop while the first call was being allowed
        return True

    out = run_tool_loop(
        Script(two, reply("never")),
        USER,
        ToolRegistry(builtins=BuiltinTools()),
        approve,
        should_cancel=lambda: stop["now"],
    )
    assert out.stopped == "cancelled" and len(out.results) == 1
    assert [(c.ran, c.result) for c in out.calls] == [(True, "1"), (False, "Not run: the user stopped the reply.")]
    cancelled_first = run_tool_loop(Script(two), USER, ToolRegistry(), lambda c: True, should_cancel=lambda: True)
    assert cancelled_first.stopped == "cancelled" and cancelled_first.results == []


def test_a_failed_generation_ends_the_loop():
    out = run_tool_loop(Script(reply("", finish="error")), USER, ToolRegistry(), lambda c: True)
    assert out.stopped == "error" and out.messages == []


def test_the_fallback_prompt_keeps_a_messages_attachments():
    attached = [{"role": "user", "content": "Read this", "attachments": ["doc"]}]
    tools = ToolRegistry(builtins=BuiltinTools()).definitions()
    out = fallback_messages(attached, tools)
    assert out[0]["role"] == "system" and "calculate" in out[0]["content"]
    assert out[1] == {"role": "user", "content": "Read this", "attachments": ["doc"]}


# -- redline chat, end to end ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def roomy_model(tmp_path_factory):
    """The tiny random model with room for a tool's definition: its byte-level tokenizer spends about 540 tokens on
    the fallback's system message with one tool, more than the shared tiny model's 512 positions."""
    return build_tiny_model(tmp_path_factory.mktemp("tools") / "tiny-tools", max_positions=2048)


def chat_with_tools(model, config, *extra):
    args = ["chat", "Add two numbers.", "--model", str(model), "--precision", "fp32", "--strategy", "kv"]
    args += ["--mcp", str(config), "--tool", "add", "--json", "--temperature", "0", "--max-new-tokens", "120"]
    return cli.main([*args, *extra])


@pytest.fixture
def mcp_json(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"echo": {"command": PY, "args": [str(ECHO)]}}}))
    return path


@pytest.mark.slow
def test_chat_forces_a_call_runs_it_on_the_server_and_feeds_the_result_back(roomy_model, mcp_json, capsys, monkeypatch):
    submitted = []
    submit = EngineService.submit

    def recording(self, request):
        submitted.append(request.messages)
        return submit(self, request)

    monkeypatch.setattr(EngineService, "submit", recording)
    assert chat_with_tools(roomy_model, mcp_json, "--tool-choice", "add", "--allow-tool", "add") == 0
    record = json.loads(capsys.readouterr().out)
    (call,) = record["tool_calls"]
    assert (call["name"], call["server"], call["approved"], call["ran"], call["is_error"]) == (
        "echo__add",
        "echo",
        True,
        True,
        False,
    )
    a, b = call["arguments"]["a"], call["arguments"]["b"]
    assert call["result"] == str(a + b) and call["ms"] > 0  # the real server added them
    first, second = record["tool_rounds"]
    assert first["finish_reason"] == "eos" and first["text"].startswith("<tool_call>")
    assistant, tool_message = record["tool_messages"][:2]
    assert tool_message == {
        "role": "tool",
        "tool_call_id": assistant["tool_calls"][0]["id"],
        "name": "echo__add",
        "content": str(a + b),
    }
    # The second reply was asked with the call and its result in its prompt (the fallback's <tool_response> turn),
    # which is that much longer than the first.
    assert len(submitted) == 2 and "echo__add" in submitted[0][0]["content"]
    response = submitted[1][-1]
    assert (
        response["role"] == "user" and json.dumps({"name": "echo__add", "content": str(a + b)}) in response["content"]
    )
    assert second["prompt_tokens"] > first["prompt_tokens"] + 20
    assert record["prompt_tokens"] == second["prompt_tokens"]  # the record's figures are the last reply's
    assert record["tools"]["offered"] == ["echo__add"] and record["tools"]["tokens"] > 100


@pytest.mark.slow
def test_chat_refuses_a_call_not_allowed_ahead_when_stdin_is_no_terminal(roomy_model, mcp_json, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    assert chat_with_tools(roomy_model, mcp_json, "--tool-choice", "echo__add", "--max-tool-rounds", "2") == 0
    out, err = capsys.readouterr()
    record = json.loads(out)
    (call,) = record["tool_calls"]
    assert (call["approved"], call["ran"]) == (False, False)
    assert call["result"] == "The user did not allow this call to echo__add; it did not run."
    assert "stdin is not a terminal" in err and "--allow-tool echo__add" in err


def test_chat_with_a_bad_mcp_json_fails_before_loading_with_its_sentence(tmp_path, capsys):
    bad = tmp_path / "mcp.json"
    bad.write_text('{"mcpServers": {"a": {"command": "x",}}}')
    assert cli.main(["chat", "hi", "--model", str(tmp_path / "no-model"), "--mcp", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad} is not valid JSON:") and "line 1, column 38" in err
    assert "Traceback" not in err
