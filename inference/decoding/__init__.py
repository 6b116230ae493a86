"""Generating tokens: the one decode path, the fast decode step, prompts from chat messages, streaming text."""
