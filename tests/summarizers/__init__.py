"""Tests of kilo_rules.engine.summarizers."""
