"""Tools a model may call while it answers, each call run only after the user allows it: MCP servers listed in an
``mcp.json`` (``config``), started and spoken to with the official ``mcp`` SDK on a thread of their own
(``mcp_client``), Redline's built-in tools that need no network (``builtin``: read a file the user allowed,
calculate), the one list of tools offered to the model (``registry``), the user's rules on which calls run without
asking (``approval``), and the loop that generates, asks, runs the calls and generates again (``loop``), here on the
engine service (``generate``). Free of Qt; the ``mcp`` package loads only when a server starts."""

from .approval import ALLOW, ALWAYS, ASK, DENY, NEVER, ONCE, ApprovalPolicy, PendingCall
from .builtin import BuiltinTools, CalculationError, calculate
from .config import McpConfigError, ServerSpec, parse_mcp_config, read_mcp_config
from .generate import ServiceGenerator, tool_tokens_job
from .loop import CallRecord, LoopResult, run_tool_loop
from .mcp_client import McpManager, McpServerError, McpTool, ToolResult
from .registry import ToolEntry, ToolRegistry, definition_tokens, qualified_name

__all__ = [
    "ALLOW",
    "ALWAYS",
    "ASK",
    "DENY",
    "NEVER",
    "ONCE",
    "ApprovalPolicy",
    "PendingCall",
    "BuiltinTools",
    "CalculationError",
    "calculate",
    "McpConfigError",
    "ServerSpec",
    "parse_mcp_config",
    "read_mcp_config",
    "ServiceGenerator",
    "tool_tokens_job",
    "CallRecord",
    "LoopResult",
    "run_tool_loop",
    "McpManager",
    "McpServerError",
    "McpTool",
    "ToolResult",
    "ToolEntry",
    "ToolRegistry",
    "definition_tokens",
    "qualified_name",
]
