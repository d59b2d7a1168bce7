"""The services: the only code that writes workflow rows (start, claim, execute, outcome, verbs)."""
