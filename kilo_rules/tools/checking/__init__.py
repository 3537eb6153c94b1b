"""What CI runs before a policy ships: check, verify, diff, policy unit tests, explain, the
machine-readable report formats and the schema generator."""
