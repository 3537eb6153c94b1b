"""JSON Schemas of the policy, session, catalog and decisions formats (data only)."""
