"""A test in a ``*_processes.py`` module, not marked ``processes``.

``tests/project/test_markers.py`` collects it and expects collection to stop, naming it.
"""


def test_probe_in_a_processes_module_unmarked():
    pass
