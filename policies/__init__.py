"""Bundled policies, prompt texts and the model catalog (data only; read with importlib.resources)."""
