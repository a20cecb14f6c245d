"""What the tests of spans share as fixtures: the field they read, and the settings that plan it in spans."""

from __future__ import annotations

import dask
import pytest
from span_helpers import SPANNED, write_field


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """The field (:func:`span_helpers.write_field`), written once for a module's tests: they only read it."""
    return write_field(tmp_path_factory.mktemp("field"))


@pytest.fixture
def spanned():
    """Few enough tasks in a graph that the field is planned in spans."""
    with dask.config.set(SPANNED):
        yield
