"""What operators run on the maintenance rows: the invariant audit and the attention it
reports (``audit.py``), the audited repairs (``repairs.py``) and the retention sweep
(``retention.py``)."""
