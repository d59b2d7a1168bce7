"""A test that starts a process, not marked ``processes``.

``tests/project/test_markers.py`` runs it and expects it to fail.
"""

import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(os.environ.get("PGBUS_MARKER_PROBE") != "1", reason="run by tests/project/test_markers.py only")
def test_probe_starts_a_process_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
