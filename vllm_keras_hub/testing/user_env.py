"""The environment a user's fresh shell gives a command.

The test process is no such shell: `conftest.py` sets `KERAS_BACKEND`, and
once vLLM has built an engine config here it has written `LD_PRELOAD`,
`TORCHINDUCTOR_COMPILE_THREADS` and `VLLM_WORKER_MULTIPROC_METHOD` into
`os.environ`. Commands users run are tested in a subprocess with this
environment instead.
"""

import os

# What a login shell has that a command may need; nothing of Keras or vLLM.
_KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER")
# The suite's own cache roots (`conftest.py`): where, not how, things run.
_CACHE_ROOTS = ("VLLM_CACHE_ROOT", "VLLM_KERAS_HUB_CACHE")


def user_env(**variables):
    """A minimal environment: the shell basics of this one, plus `variables`.

    Args:
        **variables: Variables the user would have set themselves.
    """
    kept = _KEPT + _CACHE_ROOTS
    env = {name: os.environ[name] for name in kept if name in os.environ}
    env.update(variables)
    return env
