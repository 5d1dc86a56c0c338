"""The native step of a pass, by phase: ``step.py`` runs ``observe.py``, ``selection.py``,
``attempts.py`` and ``checkpoint.py`` in order over the state of ``state.py``."""
