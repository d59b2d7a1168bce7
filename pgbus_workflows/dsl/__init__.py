"""What users declare: steps and their policies, jobs and children, schedules, and the checks run at class definition.

Plain Python below the models: nothing here imports a model, so a class body can be checked
before Django's app registry is ready. Users import these names from ``pgbus_workflows``.
"""
