"""Optional integrations, each needing an extra (docs/operations.md):

* ``durable_agent.contrib.metrics``: Prometheus metrics and a scrape view (``[metrics]``).
* ``durable_agent.contrib.health_checks``: a django-health-check backend
  (``django-health-check``).

Nothing else in durable_agent imports these modules unconditionally.
"""
