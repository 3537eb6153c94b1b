"""Prompt texts referenced by the bundled policies."""
