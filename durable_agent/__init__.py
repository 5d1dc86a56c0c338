"""durable_agent: durable agent threads for Django, kept alive by one durable alarm per host.

Importing this package touches no models and no settings.
"""

__version__ = "0.1.0.dev0"
