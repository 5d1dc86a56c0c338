"""Tests of ``durable_agent/maintenance/operators/``."""
