"""vLLM 0.32 fails KV-sharing models whose KV caches are unified into one group."""


def give_shared_layers_their_specs():
    """Works around vLLM 0.32 failing KV-sharing layers in a unified group.

    With the hybrid KV cache manager off (`--disable-hybrid-kv-cache-manager`,
    or a KV connector that does not support it, such as `ExampleConnector`),
    vLLM puts every attention layer in one KV cache group. Where the layers
    differ in shape (Gemma4's sliding and full layers have other head sizes)
    the group's spec is a `UniformTypeKVCacheSpecs`, one spec per layer
    name. `add_kv_sharing_layers_to_kv_cache_groups` then appends each
    KV-sharing layer to its target's group, but not to that per-layer spec,
    so `initialize_attn_backend` fails with `KeyError: '<shared layer>'`:
    Gemma4 could not start with either setting, vLLM's own Gemma4 included
    as read. This gives each shared layer its target's spec, the cache it
    reads.

    Remove when vLLM's `add_kv_sharing_layers_to_kv_cache_groups` records
    the shared layers in a `UniformTypeKVCacheSpecs` itself.
    """
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner, "_keras_hub_shared_specs", False):
        return
    add_shared_layers = GPUModelRunner.maybe_add_kv_sharing_layers_to_kv_cache_groups

    def maybe_add_kv_sharing_layers_to_kv_cache_groups(self, kv_cache_config):
        add_shared_layers(self, kv_cache_config)
        for group in kv_cache_config.kv_cache_groups:
            spec = group.kv_cache_spec
            if not isinstance(spec, UniformTypeKVCacheSpecs):
                continue
            for layer, target in self.shared_kv_cache_layers.items():
                if layer in group.layer_names and layer not in spec.kv_cache_specs:
                    spec.kv_cache_specs[layer] = spec.kv_cache_specs[target]

    GPUModelRunner.maybe_add_kv_sharing_layers_to_kv_cache_groups = (
        maybe_add_kv_sharing_layers_to_kv_cache_groups
    )
    GPUModelRunner._keras_hub_shared_specs = True
