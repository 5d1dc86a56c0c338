"""The maintenance rows and how they are written and read: the alarm slot (the slot row in
``rows.py``, its services in ``alarm.py``), the due queue (``due_queue.py``), the alarm
transaction (``transactions.py``) with its hand-written statements (``rows.py``), and the read
model (``selectors.py``)."""
