"""A stream's checkpoints: ``state_dict`` says where the batches handed out end, ``load_state_dict`` resumes there.

A state names the data and the plan it was saved under, so that a changed
source or another split is refused rather than misread; an elastic stream
resumes from the job's global position on any number of ranks and workers.
"""

from __future__ import annotations

from typing import Any

from daskstream.errors import InvalidArgumentError, SourceChangedError, shown
from daskstream.planning.streams import shards_digest
from daskstream.streaming.plan import StreamPlan
from daskstream.streaming.states import STATE_FORMAT, check_state

# What a state's plan may differ in when an elastic stream resumes from a global position.
_ELASTIC_FREE = ("world_size", "rank", "worker", "num_workers")


class StreamCheckpoints(StreamPlan):
    """Saving and loading a :class:`~daskstream.streaming.Stream`'s position (see its Notes)."""

    # Set by Stream.__init__ (and by daskstream.torch): whether the seed was given rather than drawn.
    seed_given: bool

    def _plan_identity(self) -> dict[str, Any]:
        """What a saved state must share with this stream for its position to mean the same batches."""
        return {
            "length": self.length,
            "axis": self.axis,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
            "shuffle_blocks": self.shuffle_blocks if self.shuffle else None,
            "shares": self.shares,
            "elastic": self.elastic,
            "shards": f"{len(self.block_bounds)} shards {shards_digest(self.block_bounds)}",
            "world_size": self.world_size,
            "rank": self.rank,
            "worker": self.worker,
            "num_workers": self.num_workers,
        }

    def state_dict(self) -> dict[str, Any]:
        """Where the batches handed out so far end, to resume there with :meth:`load_state_dict`.

        Returns
        -------
        dict
            ``epoch`` and ``batches``: the next iteration yields epoch
            ``epoch`` from this consumer's batch ``batches``: after the
            epoch's last batch, the epoch with all its batches (a resumed
            iteration yields none, and the one after it starts the next
            epoch), or, once the loop over the epoch has ended (the iterator
            is exhausted), the next epoch at 0; ``seed``;
            ``data`` and ``plan``: what the arrays and the split were, so that
            a changed source or plan is refused; for an elastic stream,
            ``start`` (the global batch the epoch's shares were cut from) and,
            where one consumer is a whole rank, ``global_batches``: the global
            batches the job has taken, ranks in step, from which a stream on
            any number of ranks resumes. Plain Python values (JSON and
            ``torch.save`` keep them).
        """
        if self._position is not None:
            epoch, batches, start, ended = self._position
        elif self._resume is not None:
            (epoch, batches, start), ended = self._resume, 0
        else:
            epoch, batches, start, ended = self.epoch, 0, 0, 0
        if ended and self.loop_ends_epoch:
            # The consumer asked past the epoch's last batch: its loop is over, the next one is the next epoch.
            # A state saved after the last batch but within the loop (at its last step) resumes where it is,
            # yielding nothing more of the epoch, as torchdata's loaders do.
            epoch, batches, start = epoch + 1, 0, 0
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "epoch": int(epoch),
            "batches": int(batches),
            "seed": self.seed,
            "order_entropy": self.order_entropy,
            "data": [i.identity for i in self.inputs],
            "plan": self._plan_identity(),
        }
        if self.elastic:
            state["start"] = int(start)
            if self.num_workers == 1:
                state["global_batches"] = int(min(start + batches * self.world_size, self.global_batches))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration resume where ``state`` (from :meth:`state_dict`) ends.

        Every field is checked first (:mod:`daskstream.streaming.states`
        lists them, their types and ranges), then that the state is of this
        stream's data and plan; a state refused leaves the stream as it was.

        Raises
        ------
        SourceChangedError
            The arrays are not the ones the state was saved from (another file,
            or the same one rewritten since).
        InvalidArgumentError
            The state is not a stream's: a field missing, unknown, of another
            type or out of range (``batches`` past the epoch's, say; the
            message names each with its value and what is expected); or the
            stream is cut otherwise (another batch size, shuffle, split...; an
            elastic stream also resumes on another world size and number of
            workers, from a rank's state).
        """
        state = check_state(state, seed=self.seed)
        data = [i.identity for i in self.inputs]
        if state["data"] != data:
            raise SourceChangedError(
                f"the saved stream state is of other data than this stream's {', '.join(i.name for i in self.inputs)}"
                f" (saved: {shown(state['data'], 200)}, now: {shown(data, 200)}): the data changed since "
                "the state was saved, so its position would not name the same items; start the epoch again without "
                "the state"
            )
        plan = self._plan_identity()
        differs = {key: (state["plan"][key], now) for key, now in plan.items() if state["plan"][key] != now}
        shuffled = self.shuffle and state["seed"] is not None
        if shuffled and self.seed_given and state["seed"] != self.seed:
            differs["seed"] = (state["seed"], self.seed)
        epoch, batches, start = state["epoch"], state["batches"], state.get("start", 0)
        if self.elastic and "global_batches" in state and set(differs) <= set(_ELASTIC_FREE):
            # The job's global position, cut afresh among this job's ranks and workers (on the same ones,
            # the batches an exact resume would give).
            batches, start = 0, state["global_batches"]
        elif differs and self.elastic and set(differs) <= set(_ELASTIC_FREE):
            raise InvalidArgumentError(
                "this state is one DataLoader worker's position, which alone does not say where the job is: "
                "to resume on another world size or number of workers, load the loader's whole state "
                "(StreamDataset.load_state_dict(loader.state_dict()) with torchdata's StatefulDataLoader), or a "
                "state saved with num_workers=0"
            )
        elif differs:
            said = "; ".join(f"{key} {shown(was)} then, {shown(now)} now" for key, (was, now) in differs.items())
            hint = (
                " (make the stream with elastic=True to resume on another world size or number of workers)"
                if set(differs) <= {*_ELASTIC_FREE, "shards"}
                else ""
            )
            raise InvalidArgumentError(
                f"the saved stream state was cut otherwise than this stream ({said}): its position would not "
                f"name the same batches; make the stream as it was{hint}"
            )
        if shuffled:
            self.seed = state["seed"]
            self.order_entropy = state["order_entropy"]
        self._resume = (epoch, batches, start)
        self.epoch = epoch
        self._position = None
