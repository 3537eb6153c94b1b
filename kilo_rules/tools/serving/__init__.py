"""Serving policies to running agents: the PolicyStore that hot-swaps revisions and the
HTTP sidecar over it."""
