"""The README's quick start is the command CI runs, and the README stays a short front page.

Its code, and every page's, runs on its own in tests/test_docs.py."""

from __future__ import annotations

import re


def _code_blocks(text, lang):
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_quick_start_has_two_commands_and_ci_runs_the_second(repo_root):
    readme = (repo_root / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1]
    commands = _code_blocks(quick, "bash")[0].strip().splitlines()
    assert len(commands) == 2
    assert "daskstream demo" in commands[0]
    assert "pytest" in commands[1]
    ci = (repo_root / ".ci" / "run").read_text().strip().splitlines()
    # CI runs it as a user types it, on a line of its own (the check of the lowest versions follows).
    assert commands[1] in ci


def test_the_readme_is_short_and_links_into_the_documentation(repo_root):
    readme = (repo_root / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (repo_root / target).is_file(), target
