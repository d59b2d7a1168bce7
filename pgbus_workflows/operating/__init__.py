"""What the CLI and the MCP tools share: who acts, the operator verbs, the reads, the schedules, text for people.

``manage.py workflows`` (:mod:`pgbus_workflows.management`) and the MCP server
(:mod:`pgbus_workflows.mcp`) both stand on this package; it imports neither.
"""
