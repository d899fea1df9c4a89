"""Tensor parallelism: each rank's shards on vLLM's parallel linears
(`parallel_linear.py`, `linear_shards.py`), the MLPs and state layers that
need more (`parallel_mlp.py`, `parallel_state.py`), and the vocabulary
(`vocab_parallel.py`).

Imports nothing: the families import their routes from here, and the
routes import the families' table.
"""
