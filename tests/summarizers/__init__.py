"""Tests of kilo_rules.summarizers."""
