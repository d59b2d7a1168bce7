"""The vendored upstream tests are run by ``tests.upstream.vendored``, in a process of their own, not by pytest."""

collect_ignore = ["vendor"]
