"""Weights from the preset, once, each rank reading only its shard."""
