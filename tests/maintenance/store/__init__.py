"""Tests of ``durable_agent/maintenance/store/``."""
