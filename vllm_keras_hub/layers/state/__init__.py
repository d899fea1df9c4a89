"""Recurrent-state layers (Gated DeltaNet) on vLLM's state cache: the state
layer each holds (`state.py`) and their install and build
(`state_routes.py`).

Imports nothing: the families import their routes from here, and the
routes import the families' table.
"""
