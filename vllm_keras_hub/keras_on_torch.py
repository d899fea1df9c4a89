"""Importing this module makes torch Keras's backend, unless the environment
names another (then `backend.require_torch_backend()` refuses to serve).

Import it before anything that imports Keras, in a module that may be the
first of ours a process imports: every import after it stays at the top.
"""

from vllm_keras_hub import backend

backend.default_to_torch()
