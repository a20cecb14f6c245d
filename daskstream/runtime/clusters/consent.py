"""The user's consent to what a cluster file cannot do on its own: run code, listen on a network.

Both settings are read from dask's configuration before the file is read
(``DASK_DASKSTREAM__CLUSTER_FILES__ALLOW_CODE=true``, a YAML file in
``~/.config/dask/``, ``dask.config.set``, or the ``--allow-code`` and
``--allow-network-listen`` options of the ``daskstream`` command), never from
the file itself; what each one lets through is decided in
:mod:`~daskstream.runtime.clusters.rules`.
"""

from __future__ import annotations

import dask.config

from daskstream.errors import InvalidArgumentError

__all__ = ["ALLOW_CODE", "ALLOW_HINTS", "ALLOW_NETWORK_LISTEN", "allowance"]

ALLOW_CODE = "daskstream.cluster-files.allow-code"
ALLOW_NETWORK_LISTEN = "daskstream.cluster-files.allow-network-listen"

ALLOW_HINTS = {
    ALLOW_CODE: (
        "a cluster file runs nothing unless you trust it: pass --allow-code, or set "
        "daskstream.cluster-files.allow-code: true in your own dask configuration "
        "(DASK_DASKSTREAM__CLUSTER_FILES__ALLOW_CODE=true)"
    ),
    ALLOW_NETWORK_LISTEN: (
        "to let it, pass --allow-network-listen, or set daskstream.cluster-files.allow-network-listen: true "
        "in your own dask configuration (DASK_DASKSTREAM__CLUSTER_FILES__ALLOW_NETWORK_LISTEN=true)"
    ),
}


def allowance(key: str, given: bool | None) -> bool:
    value = dask.config.get(key, False) if given is None else given
    if not isinstance(value, bool):
        raise InvalidArgumentError(
            f"{key} must be true or false, not {value!r}; set it in your dask configuration or the environment "
            f"(DASK_{key.upper().replace('.', '__').replace('-', '_')}=true)"
        )
    return value
