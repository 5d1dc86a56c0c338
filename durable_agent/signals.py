"""Signals durable_agent sends.

``recovery_fault``: one recovery-fault transition (created / changed / cleared), sent by the
recovery-events lane in sequence order, at least once: receivers deduplicate by
``(host.pk, event.sequence)``. Arguments: ``host`` (Host), ``event`` (RecoveryEvent). A receiver
that raises fails the delivery wave; it is retried with backoff from the same sequence.
"""

from django.dispatch import Signal

recovery_fault = Signal()
