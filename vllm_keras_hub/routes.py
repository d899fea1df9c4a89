"""Routes to vLLM for families whose KerasHub attention has none.

keras-hub 0.32 ships a serving route (`_compute_vllm_attention`, reached from
a context check at the top of `call`) in 8 families' attention layers. For
the others, `install` gives the loaded backbone's attention layers the same
kind of route, written here, so the rest of the serving path is shared.
"""


def install(backbone, family):
    """Gives `backbone`'s attention layers a vLLM route, where ours is needed.

    Args:
        backbone: The loaded KerasHub backbone.
        family: Its `families.Family`; `family.route` says whose route it
            uses: `"keras_hub"` (keras-hub's own, nothing to install) or
            `"vllm_keras_hub"` (ours).
    """
    if family.route == "keras_hub":
        return
    raise NotImplementedError(f"No route written for {family.display_name} yet.")
