"""The engine: policy files in, the exact request for the next step out.

Its rooms, from the bottom up: ``base`` (errors, source maps, caches, safe file reads,
cancellation, the network client, settings), ``text`` (token counters, tool-output
truncation), ``formats`` (every document and its typed model: policy, session, catalog,
request, bundles), ``frontend`` (resolving ``extends:`` chains, routes, the expression
language, semantic checks), ``compiler`` (compile → the frozen Plan), ``providers``,
``summarizers`` and ``importers`` (wire formats out, summaries, recorded logs in), and
``runtime`` (one step of a session under a Plan). Each room imports only the rooms below
it; the tools around the engine live in :mod:`kilo_rules.tools`.
"""
