"""An example Django project that uses pgbus_workflows."""
