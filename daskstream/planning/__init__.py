"""Pure chunk planning: shapes, dtypes and budgets in, chunk plans out."""

from daskstream.planning.budget import format_size, parse_budget
from daskstream.planning.chunks import ChunkPlan, plan_chunks

__all__ = ["ChunkPlan", "format_size", "parse_budget", "plan_chunks"]
