"""What a stream's saved state holds: every field, its type and the values it may take, checked before a load.

A state comes back from a file that anything may have changed (a JSON
checkpoint, ``torch.save``, a tf.data checkpoint, a hand edit), and a wrong
value does not fail by itself: ``batches: -1`` replays the epoch,
``batches: 10**18`` skips the rest of it, another ``order_entropy`` gives
other rows. :data:`STATE_FIELDS` and :data:`PLAN_FIELDS` are the one list of
what :meth:`~daskstream.Stream.state_dict` writes; :func:`check_state`
refuses a state with a field missing, unknown, of another type or out of
range for the plan it names, with one
:class:`~daskstream.errors.InvalidArgumentError` that names every such field,
its value and what is expected, before the stream is touched. Whether a
well-formed state is of *this* stream's data and plan is
:mod:`~daskstream.streaming.checkpoints`' to say.

>>> plan = {"length": 10, "axis": 0, "batch_size": 4, "drop_last": False, "shuffle": False,
...         "shuffle_blocks": None, "shares": "pad", "elastic": False, "shards": "1 shards 0123456789abcdef",
...         "world_size": 1, "rank": 0, "worker": 0, "num_workers": 1}
>>> state = {"format": STATE_FORMAT, "epoch": 0, "batches": 2, "seed": None, "order_entropy": None,
...          "data": ["npy-0a1b"], "plan": plan}
>>> check_state(state, seed=None) == state
True
>>> check_state({**state, "batches": 4}, seed=None)
Traceback (most recent call last):
...
daskstream.errors.InvalidArgumentError: load_state_dict takes what a daskstream stream's state_dict() returned, \
unchanged: batches is 4, expected an int from 0 to 3 (the batches this consumer takes in an epoch; 3 once the \
epoch is over). Nothing was loaded; the stream is as it was. Load the state as state_dict() returned it (JSON and \
torch.save keep it), or start the epoch without one
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from daskstream.errors import InvalidArgumentError, shown
from daskstream.planning.streams import SHARES, batch_count, elastic_shares, elastic_steps, rank_run, worker_share

# The layout of what state_dict returns; a state of another layout is refused, not misread.
STATE_FORMAT = "daskstream.stream/1"
# Seeds a stream draws are below 2**63 (random.SystemRandom().randrange(2**63)), and so is the order entropy a
# DataLoader worker mixes in (its loader's base seed, torch's int64 random_()). Epochs too: tf.data counts
# them in an int64.
INT64_LIMIT = 2**63
# What _plan_identity writes for the shards: their count and a digest (planning.streams.shards_digest).
_SHARDS = re.compile(r"[0-9]+ shards [0-9a-f]{16}")


@dataclass(frozen=True)
class Kind:
    """A type of value a field holds: what a message calls it, and the test of a value."""

    text: str
    test: Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    # numpy's integers as well (a state through a framework that stores numpy scalars); bool is not one.
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


INT = Kind("an int", _is_int)
BOOL = Kind("a bool", lambda value: isinstance(value, (bool, np.bool_)))
TEXT = Kind("a string", lambda value: isinstance(value, str))
INT_OR_NONE = Kind("an int or None", lambda value: value is None or _is_int(value))
IDENTITIES = Kind(
    "a non-empty list of the arrays' identities (strings, one per array)",
    lambda value: isinstance(value, list) and bool(value) and all(isinstance(i, str) and i for i in value),
)
MAPPING = Kind("a dict of the stream's plan", lambda value: isinstance(value, dict))


@dataclass(frozen=True)
class Saved:
    """A state whose fields all have their kind: what the range of one field may depend on.

    Attributes
    ----------
    state, plan
        The state and its plan, values as given.
    seed
        The seed of the stream the state is loaded into.
    """

    state: dict[str, Any]
    plan: dict[str, Any]
    seed: int | None

    @property
    def global_batches(self) -> int:
        """Batches the epoch's whole sequence makes under the state's plan."""
        return batch_count(int(self.plan["length"]), int(self.plan["batch_size"]), bool(self.plan["drop_last"]))

    @property
    def start(self) -> int:
        """The global batch the epoch's shares were cut from (0 unless an elastic stream's state says)."""
        return int(self.state.get("start", 0))

    def consumer_batches(self) -> int:
        """Batches the consumer that saved the state takes in its epoch, from ``start`` (an elastic stream's)."""
        plan = self.plan
        length, size, drop_last = int(plan["length"]), int(plan["batch_size"]), bool(plan["drop_last"])
        world_size, rank, shares = int(plan["world_size"]), int(plan["rank"]), plan["shares"]
        if plan["elastic"]:
            shares = elastic_shares(shares, drop_last)
        worker, num_workers = int(plan["worker"]), int(plan["num_workers"])
        if plan["elastic"]:
            # Python ranges rather than elastic_batches' arrays: no array however large the numbers.
            return len(
                range(worker, elastic_steps(self.global_batches, self.start, world_size, rank, shares), num_workers)
            )
        low, high = worker_share(rank_run(length, world_size, rank, shares), size, drop_last, worker, num_workers)
        return batch_count(high - low, size, drop_last)


# A field's range: None when the value (of the field's kind) is in it, else what is expected instead.
Within = Callable[[Any, Saved], "str | None"]


@dataclass(frozen=True)
class Field:
    """One field of a saved state (or of its plan).

    Attributes
    ----------
    name
        The key.
    kind
        The type of its value.
    within
        Its range, checked once every field has its kind; ``None``: any value of the kind.
    required
        Whether a state must hold it (else it may be left out).
    """

    name: str
    kind: Kind
    within: Within | None = None
    required: bool = True


def _at_least(low: int) -> Within:
    """A count or size of at least ``low``."""
    return lambda value, saved: None if value >= low else f"an int of at least {low}"


def _int64(what: str, none: bool = False) -> Within:
    """A count that an int64 holds: from 0 to 2**63 - 1 (or None, with ``none``)."""
    expected = f"an int from 0 to 2**63 - 1 ({what}){' or None' if none else ''}"
    return lambda value, saved: None if (value is None and none) or 0 <= value < INT64_LIMIT else expected


def _below(other: str) -> Within:
    """An index below the plan's ``other`` field (a rank below ``world_size``)."""

    def check(value: Any, saved: Saved) -> str | None:
        top = saved.plan[other]
        if top < 1:
            return None  # the plan's other field is refused: its own message says so
        return None if 0 <= value < top else f"an int from 0 to {top - 1}, below {other} ({top})"

    return check


def _format(value: Any, saved: Saved) -> str | None:
    return None if value == STATE_FORMAT else repr(STATE_FORMAT)


def _shards(value: Any, saved: Saved) -> str | None:
    return None if _SHARDS.fullmatch(value) else "'<count> shards <16 hex digits>', as state_dict() writes it"


def _shuffle_blocks(value: Any, saved: Saved) -> str | None:
    # A stream in order has no windows: its plan names none, so that two in-order streams are cut alike.
    if saved.plan["shuffle"]:
        return None if value is not None and value >= 1 else "an int of at least 1 (the plan shuffles)"
    return None if value is None else "None (the plan does not shuffle)"


def _batches(value: Any, saved: Saved) -> str | None:
    if _start_refused(saved):
        return None  # start is refused: its own message says so, and the count depends on it
    top = saved.consumer_batches()
    if 0 <= value <= top:
        return None
    after = f" from global batch {saved.start}" if saved.start else ""
    return f"an int from 0 to {top} (the batches this consumer takes in an epoch{after}; {top} once the epoch is over)"


def _seed(value: Any, saved: Saved) -> str | None:
    if value is None:
        # A shuffled stream always has a seed (drawn when none was given): its order is named by it.
        return (
            "an int (the plan shuffles, so the state carries the seed of its order)" if saved.plan["shuffle"] else None
        )
    if 0 <= value < INT64_LIMIT or value == saved.seed:
        return None
    own = f" or this stream's own seed {shown(saved.seed)}" if saved.seed is not None else ""
    return f"an int from 0 to 2**63 - 1 (the seeds a stream draws){own}"


def _start(value: Any, saved: Saved) -> str | None:
    if not saved.plan["elastic"]:
        return "no start: only an elastic stream's state (elastic=True) has one"
    top = saved.global_batches
    return None if 0 <= value <= top else f"an int from 0 to {top} (the epoch's global batches)"


def _start_refused(saved: Saved) -> bool:
    return "start" in saved.state and _start(saved.state["start"], saved) is not None


def _global_batches(value: Any, saved: Saved) -> str | None:
    if not saved.plan["elastic"]:
        return "no global_batches: only an elastic stream's state (elastic=True) has them"
    if _start_refused(saved):
        return None  # start is refused: its own message says so, and the range depends on it
    low, top = min(saved.start, saved.global_batches), saved.global_batches
    why = " (global batches the job has taken, from start to the epoch's global batches)"
    return None if low <= value <= top else f"an int from {low} to {top}{why}"


# The fields of a state's plan, as StreamCheckpoints._plan_identity writes them (in its order).
PLAN_FIELDS: tuple[Field, ...] = (
    Field("length", INT, _at_least(0)),
    Field("axis", INT, _at_least(0)),
    Field("batch_size", INT, _at_least(1)),
    Field("drop_last", BOOL),
    Field("shuffle", BOOL),
    Field("shuffle_blocks", INT_OR_NONE, _shuffle_blocks),
    Field("shares", TEXT, lambda value, saved: None if value in SHARES else f"one of {', '.join(map(repr, SHARES))}"),
    Field("elastic", BOOL),
    Field("shards", TEXT, _shards),
    Field("world_size", INT, _at_least(1)),
    Field("rank", INT, _below("world_size")),
    Field("worker", INT, _below("num_workers")),
    Field("num_workers", INT, _at_least(1)),
)

# The fields of a state, as StreamCheckpoints.state_dict writes them (start and global_batches: an elastic
# stream's; tf.data's and a torch job position's states leave them out or set them).
STATE_FIELDS: tuple[Field, ...] = (
    Field("format", TEXT, _format),
    Field("epoch", INT, _int64("an epoch")),
    Field("seed", INT_OR_NONE, _seed),
    Field("order_entropy", INT_OR_NONE, _int64("a DataLoader's base seed", none=True)),
    Field("data", IDENTITIES),
    Field("plan", MAPPING),
    Field("start", INT, _start, required=False),
    Field("batches", INT, _batches),
    Field("global_batches", INT, _global_batches, required=False),
)


def check_state(state: Any, *, seed: int | None) -> dict[str, Any]:
    """``state`` with every field checked against :data:`STATE_FIELDS` and :data:`PLAN_FIELDS`.

    Parameters
    ----------
    state
        What is to be loaded: a stream's ``state_dict()``, as saved.
    seed
        The seed of the stream it is loaded into (a state may carry it
        whatever its size: that stream was given it).

    Returns
    -------
    dict
        A copy of ``state`` (and of its plan) with numpy integers and bools
        as Python's.

    Raises
    ------
    InvalidArgumentError
        One for all the fields that are missing, unknown, of another type
        or out of range, each named with its value and what is expected.
    """
    if not isinstance(state, dict) or not isinstance(state.get("format"), str) or state["format"] != STATE_FORMAT:
        if not isinstance(state, dict):
            found = f"{type(state).__name__} {shown(state)}"
        elif "format" in state:
            found = f"a dict of format {shown(state['format'])}"
        else:
            found = f"a dict without a format: {shown(state)}"
        raise InvalidArgumentError(
            f"load_state_dict takes what a daskstream stream's state_dict() returned (a dict whose format is "
            f"{STATE_FORMAT!r}), not {found}"
        )
    problems = _layout_problems(state, STATE_FIELDS, "")
    plan = state.get("plan")
    # First the keys and the kinds, then the ranges, which read other fields (the plan's, start). A plan that
    # is not a dict is a problem already.
    if isinstance(plan, dict):
        problems += _layout_problems(plan, PLAN_FIELDS, "plan")
        if not problems:
            saved = Saved(state, plan, seed)
            problems = _range_problems(plan, PLAN_FIELDS, "plan", saved)
            problems = problems or _range_problems(state, STATE_FIELDS, "", saved)
        if not problems:
            return {**_plain(state, STATE_FIELDS), "plan": _plain(plan, PLAN_FIELDS)}
    raise InvalidArgumentError(
        "load_state_dict takes what a daskstream stream's state_dict() returned, unchanged: "
        f"{'; '.join(problems)}. Nothing was loaded; the stream is as it was. Load the state as state_dict() "
        "returned it (JSON and torch.save keep it), or start the epoch without one"
    )


def _label(key: Any, within: str) -> str:
    """How a message names a field: ``batches``, ``plan['rank']``."""
    if within:
        return f"{within}[{key!r}]"
    return key if isinstance(key, str) and key.isidentifier() else repr(key)


def _layout_problems(values: dict[Any, Any], fields: tuple[Field, ...], within: str) -> list[str]:
    """Missing and unknown keys, and values of another kind."""
    known = {field.name for field in fields}
    problems = [
        f"{_label(key, within)} is not a field of a stream's {'plan' if within else 'state'} (its fields: "
        f"{', '.join(field.name for field in fields)})"
        for key in values
        if key not in known
    ]
    for field in fields:
        if field.name not in values:
            if field.required:
                problems.append(f"{_label(field.name, within)} is missing, expected {field.kind.text}")
        elif not field.kind.test(values[field.name]):
            value = values[field.name]
            problems.append(f"{_label(field.name, within)} is {shown(value)}, expected {field.kind.text}")
    return problems


def _range_problems(values: dict[str, Any], fields: tuple[Field, ...], within: str, saved: Saved) -> list[str]:
    problems = []
    for field in fields:
        if field.within is not None and field.name in values:
            expected = field.within(values[field.name], saved)
            if expected is not None:
                problems.append(f"{_label(field.name, within)} is {shown(values[field.name])}, expected {expected}")
    return problems


def _plain(values: dict[str, Any], fields: tuple[Field, ...]) -> dict[str, Any]:
    """``values`` with numpy scalars as Python's, so that the stream keeps plain values (JSON takes them)."""
    kinds = {field.name: field.kind for field in fields}
    plain = dict(values)
    for key, value in values.items():
        if isinstance(value, np.generic):
            plain[key] = bool(value) if kinds[key] is BOOL else int(value)
    return plain
