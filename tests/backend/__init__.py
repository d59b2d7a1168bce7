"""The tests' database backend: Django's PostgreSQL backend, whose flush empties only the tables a test wrote."""
