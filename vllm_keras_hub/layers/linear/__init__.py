"""Matmuls on vLLM's linear kernels: the CPU GEMM (`linear.py`, `onednn.py`),
the tied output head (`tied_output.py`), LoRA-capable linears
(`lora_linear.py`) and the blocks that read their kernels themselves
(`kernel_readers.py`).

Imports nothing: the families import their routes from here, and the
routes import the families' table.
"""
