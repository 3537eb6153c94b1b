"""The tools around the engine, in three wings that share only the engine: ``checking``
(check, verify, diff, policy tests, explain, report formats), ``simulation`` (replay,
corpus runs, tune, the HTML report) and ``serving`` (the PolicyStore and the HTTP
sidecar); ``cli`` sits above them all."""
