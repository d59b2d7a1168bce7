"""The task benchmark's project (``bench.tasks``): the same tasks and client on two backends.

``settings_ours`` runs them on ``pgbus_workflows.tasks.WorkflowsBackend`` (this project's
virtualenv); ``settings_tasksdb`` on django-tasks-db's ``DatabaseBackend`` (its own
virtualenv, ``bench/.peers/tasksdb-venv``). Neither imports the other's backend.
"""
