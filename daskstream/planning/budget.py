"""Byte budgets: normalised once at the boundary, plain ints afterwards."""

from __future__ import annotations

from numbers import Integral, Real

from daskstream.errors import InvalidBudgetError


def parse_budget(value: int | float | str, *, name: str = "memory_budget") -> int:
    """Return ``value`` as a positive number of bytes.

    Parameters
    ----------
    value
        An int or float of bytes, or a string with a unit such as ``"512MiB"``
        or ``"2 GB"``.
    name
        What the value is called, for the error message.

    Raises
    ------
    InvalidBudgetError
        When the value is not a positive amount of bytes.

    Examples
    --------
    >>> parse_budget("512MiB")
    536870912
    >>> parse_budget(4096)
    4096
    """
    # Imported here so that the planning package stays free of dask at import time.
    from dask.utils import parse_bytes

    hint = f'give {name} as bytes (an int) or a string with a unit, e.g. "512MiB" or "2GiB"'
    if isinstance(value, bool) or not isinstance(value, (Integral, Real, str)):
        raise InvalidBudgetError(f"{name}={value!r} is not a size; {hint}")
    try:
        nbytes = int(parse_bytes(value))
    except (ValueError, TypeError) as exc:
        raise InvalidBudgetError(f"{name}={value!r} is not a size; {hint}") from exc
    if nbytes <= 0:
        raise InvalidBudgetError(f"{name}={value!r} must be more than 0 bytes; {hint}")
    return nbytes


def format_size(nbytes: float) -> str:
    """Human-readable bytes, e.g. ``"1.00 GiB"``.

    >>> format_size(3 * 2**20)
    '3.00 MiB'
    """
    from dask.utils import format_bytes

    return format_bytes(int(nbytes))
