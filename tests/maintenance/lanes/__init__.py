"""Tests of ``durable_agent/maintenance/lanes/``."""
