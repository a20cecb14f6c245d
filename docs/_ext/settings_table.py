"""The ``daskstream-settings`` directive: every ``daskstream.*`` setting, its default and what it means.

Read from the package's own ``daskstream.yaml`` (the defaults) and
``daskstream-schema.yaml`` (the descriptions), so the page cannot fall out of
step with them.
"""

from __future__ import annotations

import pathlib
from typing import Any

import yaml
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

import daskstream

PACKAGE = pathlib.Path(daskstream.__file__).parent


def _settings(schema: dict[str, Any], defaults: Any, prefix: str) -> list[tuple[str, Any, str]]:
    """``(dotted key, default, description)`` for each leaf of ``schema`` below ``prefix``."""
    rows = []
    for name, entry in schema.get("properties", {}).items():
        key = f"{prefix}.{name}" if prefix else name
        default = defaults.get(name) if isinstance(defaults, dict) else None
        if entry.get("type") == "object" and "properties" in entry:
            rows.extend(_settings(entry, default, key))
        else:
            rows.append((key, default, " ".join(str(entry.get("description", "")).split())))
    return rows


class SettingsTable(SphinxDirective):
    """A definition list of the settings: the key and its default, then its description."""

    def run(self) -> list[nodes.Node]:
        schema = yaml.safe_load((PACKAGE / "daskstream-schema.yaml").read_text())
        defaults = yaml.safe_load((PACKAGE / "daskstream.yaml").read_text())
        listing = nodes.definition_list()
        for key, default, description in _settings(schema, defaults, ""):
            term = nodes.term()
            term += nodes.literal(text=key)
            term += nodes.Text(f" (default {default!r})" if default is not None else " (default: none)")
            definition = nodes.definition()
            definition += nodes.paragraph(text=description)
            listing += nodes.definition_list_item("", term, definition)
        return [listing]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("daskstream-settings", SettingsTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
