"""Workarounds for vLLM 0.32 bugs, one per file, each saying when it can go."""
