"""Delta patch (Algorithm 1): build a decision for only what is still missing.

After the map, `NOTCOMPLETE` holds when a cell is missing or a multi-row task yielded too few
rows. `BUILDPATCHMATRIX` takes only those rows (one patch row per incomplete table row, one per
short task) and `GENPATCHTEMPLATE` restricts the template to the missing columns: each group of
rows missing the same columns becomes one validated `Decision`, planned and executed by the
same engine, and its answers merge back into the rows they target.
"""

from __future__ import annotations

from amapreduce.decision.model import Decision
from amapreduce.mapreduce.batching import plan_batches
from amapreduce.mapreduce.work import WorkBatch, WorkItem
from amapreduce.prompts import render_prompt
from amapreduce.table.table import Row, Table

__all__ = ["build_patch"]

def _key_text(table: Table, row: Row) -> str:
    return ", ".join(f"{k} = {row.cells[k].value}" for k in table.key_columns)


def _patch_decision(decision: Decision, matrix: list[list[str]], columns: list[str], why: str) -> Decision:
    by_name = {c.name: c for c in decision.column_specs}
    return Decision.parse(
        {
            "task_matrix": matrix,
            "template": render_prompt("mapreduce", "patch_template"),
            "json_schema": {"type": "object", "properties": {c: by_name[c].to_json() for c in columns}},
            "key_columns": [k for k in decision.resolved_key_columns if k in columns],
            "matrix_columns": [None, None],
            "batch_strategy": {"type": "per_atom", "rationale": why},
            "batch_size": decision.batch_size,
        }
    )


def build_patch(decision: Decision, table: Table, tables: dict[int, Table], round_no: int) -> list[WorkBatch]:
    """The work of delta-patch round `round_no` (empty when the table is complete)."""
    names = decision.columns
    work: list[WorkBatch] = []
    groups: dict[tuple[str, ...], list[Row]] = {}
    for row in table.rows:
        lacking = tuple(c for c in names if c in row.to_ask())
        if lacking:
            groups.setdefault(lacking, []).append(row)
    for g, (lacking, rows) in enumerate(groups.items(), 1):
        columns = [c for c in names if c in decision.resolved_key_columns or c in lacking]
        matrix = [[decision.task_text(r.task_index), f"{_key_text(table, r)}; find its {', '.join(lacking)}"] for r in rows]
        patch = _patch_decision(decision, matrix, columns, f"delta patch round {round_no}: rows missing {', '.join(lacking)}")
        items = [
            WorkItem(
                task_index=r.task_index,
                text=patch.task_text(k),
                forced={**decision.forced_values(r.task_index), **{c: r.cells[c].value for c in table.key_columns}},
                columns=lacking,
                single_row=True,
            )
            for k, r in enumerate(rows)
        ]
        plan = plan_batches(patch, max_batches=None, id_prefix=f"patch{round_no}.{g}-")
        work += [
            WorkBatch(batch=b, items=tuple(items[i] for i in b.indices), column_specs=patch.column_specs, phase=f"patch{round_no}")
            for b in plan.batches
        ]
    if not decision.one_row_per_task:
        need = decision.rows_per_task or 1
        short = [i for i, t in tables.items() if len(t) < need]
        if short:
            matrix = [
                [decision.task_text(i), f"{len(tables[i])} of {need} rows are found so far; find the remaining rows"]
                for i in short
            ]
            patch = _patch_decision(decision, matrix, list(names), f"delta patch round {round_no}: tasks short of rows")
            forced_cols = set(decision.forced_values(0))
            items = [
                WorkItem(
                    task_index=i,
                    text=patch.task_text(k),
                    forced=decision.forced_values(i),
                    columns=tuple(c for c in names if c not in forced_cols),
                    single_row=False,
                    expected_rows=decision.rows_per_task,
                )
                for k, i in enumerate(short)
            ]
            plan = plan_batches(patch, max_batches=None, id_prefix=f"patch{round_no}.rows-")
            work += [
                WorkBatch(batch=b, items=tuple(items[i] for i in b.indices), column_specs=patch.column_specs, phase=f"patch{round_no}")
                for b in plan.batches
            ]
    return work
