"""Where models come from: a folder, a hub id, a GGUF file or the built-in starter, and what in them could run code."""
