"""What a pass runs: the lane registry (``lane_registry.py``), lane waves (``waves.py``) on the
pass's threads (``pool.py``), native recovery and its events lane (``recovery.py``,
``recovery_events.py``), and the native step (``native/``)."""
