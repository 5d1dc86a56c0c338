"""The pass object (``state.py``: ``Pass``) and its native step, by phase: ``step.py``
(``run_native``) runs ``observe.py``, ``selection.py``, ``attempts.py`` and ``checkpoint.py``
in order over the pass."""
