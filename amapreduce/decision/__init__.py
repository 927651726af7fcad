"""The decision Θ = (task matrix, template, batching strategy) and its validation."""

from amapreduce.decision.column_types import ColumnType
from amapreduce.decision.columns import ColumnSpec, columns_from_schema
from amapreduce.decision.model import Decision, load_decision
from amapreduce.decision.strategy import ByAttr, OpenGroup, OpenStrategy, PerAtom
from amapreduce.decision.template import placeholders, render

__all__ = [
    "ByAttr",
    "ColumnSpec",
    "ColumnType",
    "Decision",
    "OpenGroup",
    "OpenStrategy",
    "PerAtom",
    "columns_from_schema",
    "load_decision",
    "placeholders",
    "render",
]
