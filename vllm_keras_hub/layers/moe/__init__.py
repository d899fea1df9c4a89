"""Mixture-of-experts blocks on vLLM's `FusedMoE`: the kernel each routed
block holds (`moe.py`), what every MoE route shares (`moe_routing.py`) and
their install and build (`moe_routes.py`).

Imports nothing: the families import their routes from here, and the
routes import the families' table.
"""
