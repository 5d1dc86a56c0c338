"""The mutation gate (``gate.py``): how producers admit work, and its one-round-trip commit on
PostgreSQL (``commit_function.py``)."""
