"""Every document kilo-rules reads or writes, as typed models with limits: YAML loading
with source maps, JSON Schema validation, policies, sessions, the model catalog and the
wire-API facts, the provider-neutral request, policy test and tune files, signed bundles."""
