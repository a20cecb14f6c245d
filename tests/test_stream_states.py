"""Saved stream states are checked field by field before a load: a tampered one is refused and changes nothing.

Every tampered state here starts as a real one, from ``state_dict()``, with one
field changed (another type, out of range, missing, unknown); the stream it is
loaded into must refuse it with one ``InvalidArgumentError`` naming that field
and go on exactly as a stream that never saw it.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import daskstream as ds
from daskstream.errors import InvalidArgumentError, SourceChangedError, shown
from daskstream.planning.streams import SHARES
from daskstream.streaming.states import (
    INT64_LIMIT,
    PLAN_FIELDS,
    STATE_FIELDS,
    STATE_FORMAT,
    Saved,
    check_state,
)

LENGTH, BATCH = 60, 7
# Rows whose first column is their index: a batch is told apart by its rows.
ARRAY = np.stack([np.arange(LENGTH), np.arange(LENGTH) * 10], axis=1)

CONFIGS = {
    "in order": {},
    "shuffled": {"shuffle": True, "seed": 4, "shuffle_blocks": 2},
    "rank 1 of 2, dropped": {"rank": 1, "world_size": 2, "shares": "drop", "drop_last": True},
    "worker 1 of 2": {"worker": 1, "num_workers": 2, "shuffle": True, "seed": 4},
    "elastic": {"elastic": True, "shuffle": True, "seed": 4, "rank": 1, "world_size": 2},
    "elastic worker": {"elastic": True, "worker": 0, "num_workers": 2},
}


def made(config: str) -> ds.Stream:
    return ds.stream(ARRAY, batch_size=BATCH, **CONFIGS[config])


def rows(batches) -> list[list[int]]:
    return [batch[:, 0].tolist() for batch in batches]


# What an uninterrupted stream of each config yields in its first two epochs.
EPOCHS = {config: (rows(s), rows(s)) for config, s in ((c, made(c)) for c in CONFIGS)}


def state_at(config: str, cut: int) -> dict:
    """The state of a stream of ``config`` once ``cut`` batches of its first epoch are taken, through JSON."""
    s = made(config)
    batches = iter(s)
    for _ in range(cut):
        next(batches)
    state = json.loads(json.dumps(s.state_dict()))
    batches.close()
    return state


def label(key, within: str | None) -> str:
    """How the error names a field: ``batches``, ``plan['rank']``."""
    if within:
        return f"{within}[{key!r}]"
    return key if isinstance(key, str) and key.isidentifier() else repr(key)


# --- every state saved loads as before -------------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS)
def test_the_state_of_every_position_resumes_exactly(config):
    first, second = EPOCHS[config]
    for cut in range(len(first) + 1):
        state = state_at(config, cut)
        assert check_state(state, seed=made(config).seed) == state  # a checked state is the state
        resumed = made(config)
        resumed.load_state_dict(state)
        # The rest of the epoch: none after its last batch, as torchdata's loaders and tf.data resume there.
        assert rows(resumed) == first[cut:]
        assert rows(resumed) == second


def test_a_state_with_the_epoch_over_resumes_at_its_end():
    # batches equal to the epoch's count is allowed: the epoch is over (tf.data's iterator ends there).
    s = made("in order")
    s.load_state_dict({**state_at("in order", 0), "batches": len(s)})
    assert rows(s) == []
    assert rows(s) == EPOCHS["in order"][1]


def test_numpy_integers_load_as_python_ints():
    state = state_at("shuffled", 3)
    state = {**state, "epoch": np.int64(0), "batches": np.int64(3), "seed": np.int64(state["seed"])}
    state["plan"] = {**state["plan"], "drop_last": np.bool_(False), "batch_size": np.int32(BATCH)}
    s = made("shuffled")
    s.load_state_dict(state)
    assert type(s.seed) is int
    assert json.loads(json.dumps(s.state_dict()))["batches"] == 3  # still plain values
    assert rows(s) == EPOCHS["shuffled"][0][3:]


# --- tampered states are refused, naming the field, and change nothing -----------------------------


def plan_of(config: str) -> dict:
    return made(config)._plan_identity()


def not_an_int() -> st.SearchStrategy:
    return st.one_of(
        st.booleans(), st.floats(allow_nan=False), st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2)
    )


def ints_outside(low: int, high: int | None) -> st.SearchStrategy:
    """Ints below ``low`` or above ``high``, some of them huge."""
    below = st.integers(max_value=low - 1) | st.just(-(2**300))
    return below if high is None else below | st.integers(min_value=high + 1) | st.just(2**300)


def bad_values(config: str, field: str, within: str | None) -> st.SearchStrategy:
    """Values ``field`` of a state of ``config`` must not take: another type, or out of range."""
    s = made(config)
    if within:
        plan = s._plan_identity()
        ranges = {"length": (0, None), "axis": (0, None), "batch_size": (1, None), "world_size": (1, None),
                  "num_workers": (1, None), "rank": (0, plan["world_size"] - 1),
                  "worker": (0, plan["num_workers"] - 1)}  # fmt: skip
        if field in ranges:
            return not_an_int() | ints_outside(*ranges[field])
        if field in ("drop_last", "shuffle", "elastic"):
            return st.integers(0, 1) | st.none() | st.text(max_size=3) | st.floats(allow_nan=False)
        if field == "shares":
            return st.text(max_size=8).filter(lambda text: text not in SHARES) | st.integers() | st.none()
        if field == "shards":
            return st.text(max_size=20).filter(lambda text: not re.fullmatch(r"[0-9]+ shards [0-9a-f]{16}", text))
        assert field == "shuffle_blocks"
        if plan["shuffle"]:
            return st.none() | ints_outside(1, None) | st.floats(allow_nan=False) | st.booleans() | st.text(max_size=3)
        return st.integers() | st.booleans() | st.text(max_size=3)
    global_batches = s.global_batches
    if field == "epoch":
        return not_an_int() | ints_outside(0, INT64_LIMIT - 1)
    if field == "batches":
        # A batch past the consumer's last, or before its first: rows skipped or delivered twice.
        return not_an_int() | ints_outside(0, len(s)) | st.just(10**18)
    if field == "seed":
        wrong = st.booleans() | st.floats(allow_nan=False) | st.text(max_size=3) | ints_outside(0, INT64_LIMIT - 1)
        return wrong | st.none() if s.shuffle else wrong
    if field == "order_entropy":
        return st.booleans() | st.floats(allow_nan=False) | st.text(max_size=3) | ints_outside(0, INT64_LIMIT - 1)
    if field == "data":
        return st.one_of(
            st.text(max_size=5), st.just([]), st.lists(st.integers(), min_size=1, max_size=2), st.just([""]),
            st.none(), st.dictionaries(st.text(max_size=2), st.text(max_size=2), min_size=1, max_size=1),
        )  # fmt: skip
    if field == "plan":
        return st.none() | st.lists(st.integers(), max_size=2) | st.text(max_size=3) | st.integers()
    if field in ("start", "global_batches"):
        if not s.elastic:
            return st.integers(0, global_batches)  # any value: only an elastic stream's state has it
        return not_an_int() | ints_outside(0, global_batches)
    raise AssertionError(field)


# What tampered() did to a field, when it did not put a value there.
MISSING, UNKNOWN = object(), object()


@st.composite
def tampered(draw) -> tuple[str, dict, str, object]:
    """A config, a real state of it with one field changed, the field's label, and the value put there (or
    ``MISSING``, ``UNKNOWN``)."""
    config = draw(st.sampled_from(sorted(CONFIGS)))
    state = copy.deepcopy(draw(st.sampled_from(STATES[config])))
    elastic = made(config).elastic
    top = [
        f.name for f in STATE_FIELDS if f.name != "format" and (elastic or f.name not in ("start", "global_batches"))
    ]
    places = [(name, None) for name in top] + [(f.name, "plan") for f in PLAN_FIELDS]
    how = draw(st.sampled_from(["value", "value", "value", "missing", "unknown"]))
    if how == "unknown":
        within = draw(st.sampled_from([None, "plan"]))
        known = {f.name for f in (PLAN_FIELDS if within else STATE_FIELDS)}
        key = draw(st.text(max_size=12).filter(lambda k: k not in known) | st.integers())
        (state["plan"] if within else state)[key] = draw(st.integers() | st.text(max_size=3))
        return config, state, label(key, within), UNKNOWN
    if how == "missing":
        required = [(name, within) for name, within in places if within or name in ("epoch", "batches", "seed",
                    "order_entropy", "data", "plan")]  # fmt: skip
        name, within = draw(st.sampled_from(required))
        del (state["plan"] if within else state)[name]
        return config, state, label(name, within), MISSING
    if not elastic and draw(st.booleans()):
        # start or global_batches in the state of a stream that is not elastic: not a field it has.
        name = draw(st.sampled_from(["start", "global_batches"]))
        state[name] = draw(bad_values(config, name, None))
        return config, state, name, state[name]
    name, within = draw(st.sampled_from(places))
    value = draw(bad_values(config, name, within))
    (state["plan"] if within else state)[name] = value
    return config, state, label(name, within), value


# Real states of each config: its first epoch's start, a batch in, the middle, its last batch, its end.
STATES = {
    config: [state_at(config, cut) for cut in sorted({0, 1, len(first) // 2, max(0, len(first) - 1)})]
    for config, (first, _) in EPOCHS.items()
}


def what_a_stream_holds(s: ds.Stream) -> tuple:
    return (s.state_dict(), s.epoch, s._resume, s._position, s.seed, s.order_entropy)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tampered())
def test_a_tampered_state_is_refused_naming_the_field_and_changes_nothing(case):
    config, state, name, value = case
    s = made(config)
    # A stream with a state loaded already (resuming at batch 1): a refused load keeps it.
    s.load_state_dict(STATES[config][1])
    held = what_a_stream_holds(s)
    with pytest.raises(InvalidArgumentError) as info:
        s.load_state_dict(state)
    message = str(info.value)
    if value is MISSING:
        assert f"{name} is missing, expected " in message
    elif value is UNKNOWN:
        assert f"{name} is not a field of a stream's" in message
    else:
        assert f"{name} is {shown(value)}, expected " in message
    assert message.count("load_state_dict takes") == 1
    assert what_a_stream_holds(s) == held
    first, second = EPOCHS[config]
    assert rows(s) == first[1:]
    assert rows(s) == second


@pytest.mark.parametrize(
    ("change", "named"),
    [
        # The cases: a replayed epoch, a skipped one, other rows, an epoch read as 2, a bool.
        ({"batches": -1}, r"batches is -1, expected an int from 0 to 9 \(the batches this consumer takes"),
        ({"batches": 10**18}, r"batches is 1000000000000000000, expected an int from 0 to 9"),
        (
            {"order_entropy": 2**300},
            r"order_entropy is 203703597633\.\.\.397376 \(91 characters\), expected an int from 0 to 2\*\*63 - 1",
        ),
        ({"epoch": 2.7}, r"epoch is 2\.7, expected an int"),
        ({"batches": True}, r"batches is True, expected an int"),
        ({"epoch": -1}, r"epoch is -1, expected an int from 0 to 2\*\*63 - 1"),
        # Past Python's digits limit for str(): still named, by its size.
        ({"batches": 10**5000}, r"batches is an int of 16610 bits, expected an int from 0 to 9"),
    ],
)
def test_the_message_names_the_field_its_value_and_what_is_expected(change, named):
    s = made("in order")
    with pytest.raises(InvalidArgumentError, match=named) as info:
        s.load_state_dict({**state_at("in order", 2), **change})
    assert "Nothing was loaded; the stream is as it was" in str(info.value)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda state: state.pop("data"), r"data is missing, expected a non-empty list"),
        (lambda state: state.pop("plan"), r"plan is missing, expected a dict"),
        (lambda state: state.pop("batches"), r"batches is missing, expected an int"),
        (lambda state: state.update(plan=[1]), r"plan is \[1\], expected a dict"),
        (lambda state: state["plan"].pop("rank"), r"plan\['rank'\] is missing, expected an int"),
        (lambda state: state["plan"].update(rank=1), r"plan\['rank'\] is 1, expected an int from 0 to 0, below world"),
        (lambda state: state.update(epoch="1"), r"epoch is '1', expected an int"),
        (lambda state: state.update(extra=1), r"extra is not a field of a stream's state \(its fields: format, "),
    ],
)
def test_a_missing_or_unknown_field_or_a_plan_not_a_dict_is_refused_by_name(change, named):
    state = state_at("in order", 2)
    change(state)
    with pytest.raises(InvalidArgumentError, match=named):
        made("in order").load_state_dict(state)


def test_every_bad_field_is_named_in_one_error():
    state = {
        **state_at("in order", 2),
        "epoch": -1,
        "order_entropy": "x",
        "plan": {**plan_of("in order"), "axis": None},
    }
    with pytest.raises(InvalidArgumentError) as info:
        made("in order").load_state_dict(state)
    # The kinds first (ranges read the plan): order_entropy's and the plan's axis, in one message.
    assert "order_entropy is 'x', expected an int or None" in str(info.value)
    assert "plan['axis'] is None, expected an int" in str(info.value)


def test_what_is_not_a_state_is_refused_as_before():
    for state in ([1, 2], {"epoch": 0}, {"format": ["x"]}, {"format": "daskstream.stream/0"}, None):
        with pytest.raises(InvalidArgumentError, match=r"takes what a daskstream stream's state_dict\(\) returned"):
            made("in order").load_state_dict(state)


def test_a_given_seed_of_any_size_loads_into_its_own_stream():
    # Seeds a stream draws are below 2**63; a seed given is the user's, whatever its size.
    big = ds.stream(ARRAY, batch_size=BATCH, shuffle=True, seed=2**70)
    state = big.state_dict()
    again = ds.stream(ARRAY, batch_size=BATCH, shuffle=True, seed=2**70)
    again.load_state_dict(state)
    assert rows(again) == rows(ds.stream(ARRAY, batch_size=BATCH, shuffle=True, seed=2**70))
    with pytest.raises(
        InvalidArgumentError, match=r"seed is 1180591620717411303424, expected an int from 0 to 2\*\*63"
    ):
        ds.stream(ARRAY, batch_size=BATCH, shuffle=True).load_state_dict(state)


def test_a_well_formed_state_of_other_data_or_plan_is_still_told_apart():
    state = state_at("in order", 2)
    with pytest.raises(SourceChangedError, match=r"of other data"):
        made("in order").load_state_dict({**state, "data": ["npy-0123"]})
    with pytest.raises(InvalidArgumentError, match=r"batch_size 8 then, 7 now"):
        made("in order").load_state_dict({**state, "plan": {**state["plan"], "batch_size": 8}})


# --- the schema is the one list, and its ranges are the stream's -----------------------------------


def test_the_schema_lists_every_field_a_state_has():
    for config in CONFIGS:
        s = made(config)
        assert [f.name for f in PLAN_FIELDS] == list(s._plan_identity())
        written = set(s.state_dict())
        assert written <= {f.name for f in STATE_FIELDS}
        assert {f.name for f in STATE_FIELDS if f.required} <= written
    assert made("in order").state_dict()["format"] == STATE_FORMAT


def test_the_guide_describes_every_field():
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "streaming.md").read_text()
    for field in (*STATE_FIELDS, *PLAN_FIELDS):
        assert f"`{field.name}`" in guide, field.name


@settings(max_examples=150, deadline=None)
@given(
    length=st.integers(1, 40),
    batch_size=st.integers(1, 9),
    world_size=st.integers(1, 4),
    num_workers=st.integers(1, 3),
    shares=st.sampled_from(SHARES),
    drop_last=st.booleans(),
    elastic=st.booleans(),
    data=st.data(),
)
def test_the_batches_bound_is_what_the_consumer_yields(
    length, batch_size, world_size, num_workers, shares, drop_last, elastic, data
):
    rank, worker = data.draw(st.integers(0, world_size - 1)), data.draw(st.integers(0, num_workers - 1))
    s = ds.stream(
        np.arange(length), batch_size=batch_size, world_size=world_size, rank=rank, num_workers=num_workers,
        worker=worker, shares=shares, drop_last=drop_last, elastic=elastic,
    )  # fmt: skip
    state = s.state_dict()
    start = data.draw(st.integers(0, s.global_batches)) if elastic else 0
    if elastic:
        state["start"] = start
    saved = Saved(state, state["plan"], s.seed)
    assert saved.consumer_batches() == s._batches_left(start)
    if start == 0:
        assert saved.consumer_batches() == len(list(s))  # the brute-force count


# --- torch: a StatefulDataLoader's state is checked too --------------------------------------------


def loader_state(states: dict) -> dict:
    """A StatefulDataLoader's state with workers, as torchdata 0.11 lays it out, holding ``states``."""
    return {
        "_snapshot": {
            "_main_snapshot": {"_num_workers": len(states)},
            "_worker_snapshots": {
                key: {"dataset_state": state, "worker_id": i} for i, (key, state) in enumerate(states.items())
            },
        },
        "_iterator_finished": False,
    }


def worker_states(cut: int = 2) -> dict:
    states = {}
    for worker in range(2):
        s = ds.stream(ARRAY, batch_size=BATCH, elastic=True, shuffle=True, seed=4, worker=worker, num_workers=2)
        batches = iter(s)
        for _ in range(cut):
            next(batches)
        states[f"worker_{worker}"] = s.state_dict()
        batches.close()
    return states


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda states: states["worker_1"].update(batches=-1), r"'worker_1': .*batches is -1, expected an int from 0"),
        (lambda states: states["worker_0"]["plan"].update(worker=1), r"workers \[1, 1\] of 2"),
        (lambda states: states["worker_1"].update(seed=5), r"'worker_1' differs from the other workers' in seed"),
        (lambda states: states["worker_1"].update(epoch=3), r"in epochs \[0, 3\]"),
        (lambda states: states["worker_0"].pop("plan"), r"'worker_0': .*plan is missing"),
    ],
)
def test_a_tampered_loader_state_is_refused_by_a_stream_dataset(change, named):
    pytest.importorskip("torch", reason="the PyTorch adapter needs torch")
    from daskstream import torch as torch_adapter

    dataset = torch_adapter.StreamDataset(ARRAY, batch_size=BATCH, elastic=True, shuffle=True, seed=4)
    states = worker_states()
    dataset.load_state_dict(loader_state(copy.deepcopy(states)))  # as saved: loads
    dataset = torch_adapter.StreamDataset(ARRAY, batch_size=BATCH, elastic=True, shuffle=True, seed=4)
    held = what_a_stream_holds(dataset._plan)
    change(states)
    with pytest.raises(InvalidArgumentError, match=named):
        dataset.load_state_dict(loader_state(states))
    assert what_a_stream_holds(dataset._plan) == held
    assert dataset._job_position is None


@pytest.mark.parametrize(
    ("state", "named"),
    [
        ({"_snapshot": [1]}, r"_snapshot is \[1\], expected a dict"),
        ({"_snapshot": {"_worker_snapshots": {"worker_0": 3}}}, r"snapshot of 'worker_0' is 3, expected a dict"),
        ({"_snapshot": {"_worker_snapshots": {}}}, r"holds no StreamDataset position"),
        ({"_num_yielded": 3}, r"holds no StreamDataset position"),
        ({"_num_yielded": 3, "dataset_state": {"format": STATE_FORMAT}}, r"epoch is missing"),
    ],
)
def test_a_loader_state_not_laid_out_as_torchdata_lays_it_is_refused(state, named):
    pytest.importorskip("torch", reason="the PyTorch adapter needs torch")
    from daskstream import torch as torch_adapter

    dataset = torch_adapter.StreamDataset(ARRAY, batch_size=BATCH, elastic=True, shuffle=True, seed=4)
    with pytest.raises(InvalidArgumentError, match=named):
        dataset.load_state_dict(state)
