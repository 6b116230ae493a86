"""The conversation database's tables as releases before the attachments (and the Tools switch) wrote them: what
the store's migrations must open without losing a conversation or a message (test_store_attachments.py,
test_store_tools.py)."""

TABLES = (
    "CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, "
    "system_prompt TEXT NOT NULL DEFAULT '', created REAL NOT NULL, updated REAL NOT NULL);"
    "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id INTEGER NOT NULL REFERENCES "
    "conversations(id) ON DELETE CASCADE, position INTEGER NOT NULL, role TEXT NOT NULL CHECK (role IN "
    "('user', 'assistant')), content TEXT NOT NULL, partial INTEGER NOT NULL DEFAULT 0, stats TEXT, "
    "created REAL NOT NULL, reasoning TEXT NOT NULL DEFAULT '');"
)
