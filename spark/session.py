"""What a task can see of its Spark session.

Spark hands Python data sources their options, not the session: the only window is the
local properties it sets on every task of a job — the session's explicitly set SQL confs
(``spark.sql.session.timeZone``, ``spark.sql.caseSensitive``, …) and, in a streaming
query, its id (``sql.streaming.queryId``). A conf left at its default is absent.
"""

from __future__ import annotations

__all__ = ["task_property"]


def task_property(name: str) -> str | None:
    """The local property ``name`` of the running Spark task (``None`` outside a task or
    when Spark did not set it)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return None if ctx is None else ctx.getLocalProperty(name)
