"""An installed app whose ``agents.py`` and ``lanes.py`` nothing imports by name."""
