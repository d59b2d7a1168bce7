"""Django signals for instrumentation, sent after the transaction that caused them commits.

Every receiver gets ``sender`` (the workflow class name) and keyword arguments:

- ``workflow_started``: ``workflow_id``, ``subject_type``, ``subject_id``
- ``workflow_transitioned``: ``workflow_id``, ``transition``, ``from_status``, ``to_status``, ``actor``
- ``step_finished``: ``workflow_id``, ``step_name``, ``attempt``, ``status``, ``outcome``, ``error_class``
  and ``duration`` (seconds from the claim to the end; None for an attempt that never started)
- ``signal_received``, ``wait_timed_out``: ``workflow_id`` and the signal or step names
- ``workflow_gauge``: ``statuses`` and ``stuck`` (lists of counts), sent by the sweep
- ``sweep_finished``: ``summary`` (a dict of counts per sweep phase)
- ``schedule_failed``: ``schedule`` (its name) and ``error_class``: a schedule's tick could not start its run
"""

from django.dispatch import Signal

workflow_started = Signal()
workflow_transitioned = Signal()
step_finished = Signal()
signal_received = Signal()
wait_timed_out = Signal()
workflow_gauge = Signal()
sweep_finished = Signal()
schedule_failed = Signal()
