"""Importing this module makes torch Keras's backend, and refuses another
that the environment names (`backend.require_torch_backend`).

Import it before anything that imports Keras, in a module that may be the
first of ours a process imports: every import after it stays at the top.
A family's model class (`families/<name>/media.py`) is such a module: vLLM
imports it by name in a fresh process, after the `families` table, which
imports this first.
"""

from vllm_keras_hub import backend

backend.require_torch_backend()
