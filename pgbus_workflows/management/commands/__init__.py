"""The ``manage.py`` commands: ``run_workflow_dispatcher``, ``workflows`` and ``workflows_mcp``."""
