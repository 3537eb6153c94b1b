"""compile(policy, model) → Plan: the stage table and the frozen Plan it produces."""
