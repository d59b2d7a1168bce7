"""Sphinx configuration: MyST Markdown pages, the API from its docstrings, diagrams drawn from the code.

Built by ``bash scripts/docs`` into ``docs/_build/html``, warnings as errors. Django is set up
with the example project's settings (no database is opened), so autodoc imports the package
as an installed app does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
django.setup()

project = "pgbus-workflows"
author = "the pgbus-workflows authors"
copyright = "the pgbus-workflows authors"  # noqa: A001 (Sphinx's name)
extensions = ["myst_parser", "sphinx.ext.autodoc", "pgbus_docs", "pgbus_reference"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
html_theme = "furo"
html_title = "pgbus-workflows"
