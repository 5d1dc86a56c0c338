"""What operators run on the maintenance rows: the invariant audit (``audit.py``), the audited
repairs (``repairs.py``) and the retention sweep (``retention.py``)."""
