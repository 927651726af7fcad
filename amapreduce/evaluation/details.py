"""Per-row detail records, laid out like the official `<id>_eval_result.csv` audit file.

Why: when a score looks wrong, the official CSV is how people find the cell that failed. The
layout is the same: joined rows with `<col>_query`, `<col>_response`, `<col>_<metric>` and
`<col>_<metric>_eval_msg`, then the unmatched rows of the outer join flagged by
`exist_flag_gt` / `exist_flag_response`; key columns first, then the rest, each sorted.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from amapreduce._atomic import atomic_open

__all__ = ["detail_records", "write_details_csv"]


def detail_records(
    required: list[str],
    unique: list[str],
    resp: list[list[str]],
    gold: list[list[str]],
    before_map: dict[str, list[str]],
    pairs: list[tuple[int, int]],
    scores: dict[str, list[float]],
    messages: dict[str, list[str]],
    resp_keys: list[tuple[str, ...]],
    gold_keys: list[tuple[str, ...]],
) -> list[dict[str, Any]]:
    """Build the records (joined rows first, then gold-only and response-only rows)."""
    others = [c for c in required if c not in unique]
    records: list[dict[str, Any]] = []
    for p, (gi, ri) in enumerate(pairs):
        rec: dict[str, Any] = {c: gold[required.index(c)][gi] for c in unique}
        for col, values in before_map.items():
            rec[f"{col}_before_map"] = values[ri]
        for col in others:
            ci = required.index(col)
            rec[f"{col}_query"] = gold[ci][gi]
            rec[f"{col}_response"] = resp[ci][ri]
        for name, score_values in scores.items():
            rec[name] = score_values[p]
        for name, msg_values in messages.items():
            rec[name] = msg_values[p]
        records.append(rec)
    matched_gold = {gi for gi, _ in pairs}
    matched_resp = {ri for _, ri in pairs}
    for gi, key in enumerate(gold_keys):
        if gi in matched_gold:
            continue
        rec = dict(zip(unique, key, strict=True))
        rec.update({f"{c}_query": gold[required.index(c)][gi] for c in others})
        rec["exist_flag_gt"] = 1
        records.append(rec)
    for ri, key in enumerate(resp_keys):
        if ri in matched_resp:
            continue
        rec = dict(zip(unique, key, strict=True))
        rec.update({f"{col}_before_map": values[ri] for col, values in before_map.items()})
        rec.update({f"{c}_response": resp[required.index(c)][ri] for c in others})
        rec["exist_flag_response"] = 1
        records.append(rec)
    return records


def write_details_csv(path: Path, records: list[dict[str, Any]], unique: list[str]) -> None:
    """Write the records as CSV (atomically), key columns first, both groups sorted."""
    names: list[str] = []
    for rec in records:
        names.extend(k for k in rec if k not in names)
    for flag in ("exist_flag_gt", "exist_flag_response"):
        if flag not in names:
            names.append(flag)
    keys = set(unique) | {f"{c}_before_map" for c in unique} | {"exist_flag_gt", "exist_flag_response"}
    ordered = sorted(n for n in names if n in keys) + sorted(n for n in names if n not in keys)
    with atomic_open(path, newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=ordered)
        writer.writeheader()
        writer.writerows(records)
