"""Engine settings a hybrid (Gated DeltaNet) preset is served exactly under.

Part of `settings.check`: a Gated DeltaNet layer keeps its recurrent state in
float32 and its convolution window in the model's dtype, and hybrid presets
are refused speculative decoding (their state layers cannot roll back
rejected drafts), LoRA adapters per request (no test proves them exact) and
KV transfer (their state would have to travel with the KV cache).
"""


class UnsupportedHybridConfigError(ValueError):
    """An engine setting hybrid (Gated DeltaNet) presets cannot be served with."""


def check_hybrid_settings(
    speculative=False,
    mamba_ssm_cache_dtype="auto",
    mamba_cache_dtype="auto",
    mamba_cache_mode=None,
    enable_lora=False,
    kv_connector=None,
):
    """Raises for engine settings a hybrid preset's state cannot be served with.

    Part of `settings.check`.

    Args:
        speculative: Whether speculative decoding is configured.
        mamba_ssm_cache_dtype: vLLM's `mamba_ssm_cache_dtype`.
        mamba_cache_dtype: vLLM's `mamba_cache_dtype`.
        mamba_cache_mode: vLLM's `mamba_cache_mode`, or `None` if unset.
        enable_lora: vLLM's `enable_lora`.
        kv_connector: The KV connector of vLLM's `kv_transfer_config`, if any.

    Raises:
        UnsupportedHybridConfigError: naming the setting and why.
    """
    if speculative:
        raise UnsupportedHybridConfigError(
            "Speculative decoding is not supported for KerasHub's hybrid "
            "(Gated DeltaNet) presets: rolling back rejected draft tokens "
            "needs vLLM's wider speculative state layout, which their state "
            "layers do not implement. Serve without --speculative-config."
        )
    # vLLM's CPU platform itself turns "auto" into "float32" for GDN models.
    if mamba_ssm_cache_dtype not in (None, "auto", "float32"):
        raise UnsupportedHybridConfigError(
            f"mamba_ssm_cache_dtype={mamba_ssm_cache_dtype!r} is not supported: "
            "KerasHub keeps a Gated DeltaNet layer's recurrent state in "
            "float32, and served output must equal the preset's own."
        )
    if mamba_cache_dtype not in (None, "auto"):
        raise UnsupportedHybridConfigError(
            f"mamba_cache_dtype={mamba_cache_dtype!r} is not supported: KerasHub "
            "keeps a Gated DeltaNet layer's convolution window in the model's "
            "dtype."
        )
    if mamba_cache_mode not in (None, "none", "align"):
        raise UnsupportedHybridConfigError(
            f"mamba_cache_mode={mamba_cache_mode!r} is not supported for Gated "
            "DeltaNet layers: prefix caching runs in 'align' mode."
        )
    if enable_lora:
        raise UnsupportedHybridConfigError(
            "LoRA adapters per request (--enable-lora) are not supported for "
            "hybrid (Gated DeltaNet) presets yet: no test proves them exact "
            "there. Serve without --enable-lora."
        )
    if kv_connector:
        raise UnsupportedHybridConfigError(
            f"KV transfer (--kv-transfer-config, {kv_connector}) is not "
            "supported for hybrid (Gated DeltaNet) presets: their recurrent "
            "state would have to travel with the KV cache. vLLM 0.32 turns "
            "the hybrid KV cache manager off for connectors without "
            "`SupportsHMA` (ExampleConnector among them), and then fails to "
            "start a state model (\"Failed to promote local KV cache specs\"); "
            "no connector's state transfer is tested here."
        )
