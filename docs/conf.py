"""Sphinx configuration of daskstream's documentation (``sphinx-build -W docs docs/_build``)."""

from __future__ import annotations

import pathlib
import sys

import daskstream

sys.path.insert(0, str(pathlib.Path(__file__).parent / "_ext"))

project = "daskstream"
release = version = daskstream.__version__
copyright = "daskstream's authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinx.ext.intersphinx",
    "sphinx_click",
    "settings_table",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
root_doc = "index"
# What a reader copies is what they type: "--chunks" stays two hyphens, quotes stay straight (docutils
# would otherwise turn "--" into an en dash in the command-line reference and every page's prose).
smartquotes = False

# Anchors for the headings of every page, so that pages link to each other's sections.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]

# The API reference is generated from the numpydoc docstrings of the public names.
autosummary_generate = False
autodoc_typehints = "none"
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# Other projects' pages are linked where names of theirs appear; the build needs no network for it.
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}

html_theme = "furo"
html_title = f"daskstream {version}"
html_static_path: list[str] = []
