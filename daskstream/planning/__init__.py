"""Pure chunk planning: shapes, dtypes and settings in, chunk plans out.

Nothing in this package reads files or settings, asks a scheduler, uses dask
beyond its byte-size helpers or shows anything (the notebook views of its
results are :mod:`daskstream.views`): every input arrives as a value (:class:`PlanSettings` for the budget and
parallelism), resolved once where a call enters daskstream.
"""

from daskstream.planning.budget import format_size, parse_budget
from daskstream.planning.chunks import plan_chunks
from daskstream.planning.plan import ChunkPlan
from daskstream.planning.settings import PlanSettings, Resources

__all__ = ["ChunkPlan", "PlanSettings", "Resources", "format_size", "parse_budget", "plan_chunks"]
