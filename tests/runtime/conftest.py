"""Each runtime test leaves dask's scheduler setting as it found it.

distributed's Client sets ``scheduler`` in dask's configuration as it starts; one
that fails to connect (the refusal tests) can leave it set. Only that key is put
back: packages imported during a test (dask-jobqueue, dask-kubernetes) add their
own defaults to the configuration, and those must stay.
"""

from __future__ import annotations

import dask.config
import pytest

_UNSET = object()


@pytest.fixture(autouse=True)
def _restore_scheduler_setting():
    saved = dask.config.config.get("scheduler", _UNSET)
    yield
    if saved is _UNSET:
        dask.config.config.pop("scheduler", None)
    else:
        dask.config.config["scheduler"] = saved
