"""Tools in the window (docs/chat.md, "Tools and MCP servers"): the window's MCP servers, built-in tools and approval
rules (``service.py``), one reply through the tool loop on a worker thread (``run.py``), a reply's calls in the
transcript with the question that asks the user (``calls_view.py``), and Settings → Tools with its mcp.json editor
(``settings_page.py``, ``mcp_editor.py``). The window's switch per conversation is ``ui/window/tools_controller.py``."""
