"""Attention on vLLM's kernels: each family's attention routes installed
on its layers (`attention.py`, `attention_routes.py`), the kernel each
routed layer holds (`paged_attention.py`), bidirectional image rows
(`image_attention.py`) and the rotary tables (`rotary_tables.py`).

Imports nothing: the families import their routes from here, and the
routes import the families' table.
"""
