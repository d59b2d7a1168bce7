"""The engine: every write of workflow rows, and the read models the operator's faces share.

Writers (nothing outside this folder writes workflow rows; every state move happens under
the run's row lock, ``locks``, recorded by the run's ``ledger``): ``start`` (with ``debounce``
and ``duplicates``), ``claims``, ``executor`` (with ``body``, ``context``, ``atomic``,
``chain``, ``applying``, ``outcome``), ``signals``, ``waiting``, ``fanout`` and
``fanout_recovery``, ``children`` and ``lineage``, ``operator`` (the verbs), ``schedules``
and ``firing``, ``limiting``, ``deploys``, ``retention``; their helpers ``handle``
(``RunHandle``), ``payload``, ``transactions`` and ``isolation``.

Read models, which write nothing: ``insights`` (a class's pipeline, performance and funnel),
``stuck`` (runs by class, status and stuck reason) and ``results`` (waiting for a run's end).
"""
