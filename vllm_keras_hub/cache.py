"""Where vllm-keras-hub keeps its files: the default model, converted adapters."""

import os


def default_cache_dir():
    """Returns the user cache folder of vllm-keras-hub.

    `$VLLM_KERAS_HUB_CACHE` if set, else `$XDG_CACHE_HOME/vllm-keras-hub`, else
    `~/.cache/vllm-keras-hub`.
    """
    explicit = os.environ.get("VLLM_KERAS_HUB_CACHE")
    if explicit:
        return os.path.expanduser(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return os.path.join(xdg, "vllm-keras-hub")
