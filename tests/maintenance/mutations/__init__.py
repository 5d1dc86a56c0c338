"""Tests of ``durable_agent/maintenance/mutations/``."""
