"""The speed model: decode tokens/s and time to first token predicted before loading, corrected per machine."""
