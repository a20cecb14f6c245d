"""How a stream shows itself: :meth:`explain`'s plain-text account, its repr and its notebook card.

Also the read amplification the account reports: bytes read per byte delivered.
"""

from __future__ import annotations

from daskstream.display import card, grid_figure, table
from daskstream.planning.budget import format_size
from daskstream.streaming.elastic import wrapped_runs
from daskstream.streaming.plan import StreamPlan


class StreamView(StreamPlan):
    """What a :class:`~daskstream.streaming.Stream` says of its split, order, reads and memory."""

    @property
    def read_amplification(self) -> float:
        """Bytes read per byte delivered in an epoch of this consumer (1.0: each item read once; storage
        chunks read whole count whole)."""
        delivered = sum(high - low for low, high in self._delivered())
        if not delivered:
            return 1.0
        unit = self.inputs[0].unit(self.axis)
        read = 0
        for low, high in self._pieces(0):
            read += min(self.length, -(-high // unit) * unit) - (low // unit) * unit
        return read / delivered

    def _delivered(self) -> list[tuple[int, int]]:
        """The items this consumer yields in an epoch, as runs of the epoch's sequence."""
        if not self.elastic:
            return [(self.share[0], self.share[1])]
        return [run for low, high in self._elastic_batches(0).tolist() for run in wrapped_runs(low, high, self.length)]

    def explain(self) -> str:
        """Plain-text account of the split, the order, the reads and what the stream holds."""
        first_shard = self.block_bounds[0][1] - self.block_bounds[0][0] if self.block_bounds else 0
        names = ", ".join(f"{i.name} {i.shape} {i.dtype}" for i in self.inputs)
        terms = self.memory_terms
        held = ", ".join(f"{term} {format_size(n)}" for term, n in terms.items() if n)
        if self.elastic:
            split = (
                f"elastic: one global order of {self.global_batches} batches for any world size; rank "
                f"{self.rank} of {self.world_size} takes global batches {self.rank}, {self.rank + self.world_size}, "
                f"{self.rank + 2 * self.world_size}..."
                + (f", its worker {self.worker} of {self.num_workers} one in {self.num_workers} of those"
                   if self.num_workers > 1 else "")
            )  # fmt: skip
        else:
            split = (
                f"rank {self.rank} of {self.world_size} takes run {self.rank} (counting from 0) of "
                f"{self.world_size} equal runs of the epoch's shards ({self.shares})"
                + (f", its worker {self.worker} of {self.num_workers} a contiguous part" if self.num_workers > 1
                   else "")
            )  # fmt: skip
        order = (
            f"shuffled: shards in a random order, the items of each window of {self.shuffle_blocks} shard(s) "
            f"(up to {self.shuffle_blocks * first_shard} items) mixed; (seed, epoch) fixes it"
            if self.shuffle
            else "in order"
        )
        amplification = self.read_amplification
        cost = (
            "each item read once"
            if amplification < 1.005
            else f"{amplification:.2f} bytes read per byte delivered"
            + (" (every window a batch is taken from is read whole)" if self.elastic and self.shuffle else "")
        )
        return "\n".join(
            [
                f"Stream of {names}: {self.length} items along axis {self.axis} "
                f"({format_size(self.item_bytes)} each), batches of {self.batch_size}",
                f"Shards: {len(self.block_bounds)} storage-aligned runs of up to {first_shard} items, the same on "
                "every rank",
                f"Split: {split}; this consumer yields {len(self)} batches an epoch",
                f"Order: {order}",
                f"Reads: up to {self.read_rows} items a read, {self.threads} reading thread(s); {cost}",
                f"Holds at most {format_size(self.projected_peak_bytes)}: {held}, within its budget of "
                f"{format_size(self.resources.memory_budget)} (a fifth kept free)",
                "Between epochs: "
                + (
                    "the next epoch's first reads are begun during the last batches and kept, with the reading "
                    "threads, until it starts or close()"
                    if self.read_next_epoch
                    else "nothing is read ahead or kept; the reading threads end with each epoch"
                ),
            ]
        )

    def __repr__(self) -> str:
        names = ", ".join(i.name for i in self.inputs)
        shard = f", rank {self.rank}/{self.world_size}" if self.world_size > 1 else ""
        if self.num_workers > 1:
            shard += f", worker {self.worker}/{self.num_workers}"
        return (
            f"<daskstream Stream of {names}: {self.length} items along axis {self.axis}, batches of "
            f"{self.batch_size}, {len(self.block_bounds)} shards, prefetch {self.prefetch}"
            f"{', shuffled' if self.shuffle else ''}{shard}>"
        )

    def _repr_html_(self) -> str:
        first_shard = self.block_bounds[0][1] - self.block_bounds[0][0] if self.block_bounds else 0
        rows = [
            ("arrays", ", ".join(f"{i.name} {i.shape} {i.dtype}" for i in self.inputs)),
            ("items", f"{self.length} along axis {self.axis} ({format_size(self.item_bytes)} each)"),
            ("batch", f"{self.batch_size} items ({format_size(self.batch_size * self.item_bytes)})"),
            ("shards", f"{len(self.block_bounds)} storage-aligned runs of up to {first_shard} items, "
                       "the same on every rank"),
            ("reads", f"up to {self.read_rows} items, {self.threads} reading thread(s)"),
            ("prefetch", f"{self.prefetch} batches, up to {self.extra_reads} more reads when the loop waits"),
            ("order", f"shuffled in windows of {self.shuffle_blocks} shards" if self.shuffle else "in order"),
            ("share", f"rank {self.rank} of {self.world_size} ({self.shares}): {len(self)} batches"
                      + (f", worker {self.worker} of {self.num_workers}" if self.num_workers > 1 else "")),
        ]  # fmt: skip

        first = self.inputs[0]
        storage = first.source.storage_chunks if first.source is not None else None
        block = tuple(first_shard if a == self.axis else n for a, n in enumerate(first.shape))
        return card("daskstream Stream", table(rows), picture=grid_figure(first.shape, storage, block))
