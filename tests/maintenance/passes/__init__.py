"""Tests of ``durable_agent/maintenance/passes/``."""
