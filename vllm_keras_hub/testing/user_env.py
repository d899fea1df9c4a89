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


def user_env(**variables):
    """A minimal environment: the shell basics of this one, plus `variables`.

    Args:
        **variables: Variables the user would have set themselves.
    """
    env = {name: os.environ[name] for name in _KEPT if name in os.environ}
    env.update(variables)
    return env
