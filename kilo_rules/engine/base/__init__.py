"""Foundations every room of the engine stands on: the error hierarchy and its located
diagnostics, source maps, the one bounded cache, immutable containers, cancellation,
symlink-safe file reads, the read sandbox, linear-time regexes, the one network client,
environment settings, system-transform plugins and the version."""
