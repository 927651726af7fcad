"""Write each gold table as a markdown answer file: the "gold pass" of docs/scorer-rules.md §11.

Usage:
    .venv/bin/python eval/render_gold.py --tasks ../shared/data/widesearch/widesearch.jsonl \
        --gold-dir ../shared/data/widesearch/widesearch_gold --out runs/gold_answers
    .venv/bin/amapreduce eval score --tasks ../shared/data/widesearch/widesearch.jsonl \
        --gold-dir ../shared/data/widesearch/widesearch_gold --pred-dir runs/gold_answers --out runs/gold.json

Why: scoring the gold itself shows the ceiling of the offline stand-ins (163/200 successes,
mean row F1 0.9507, item F1 0.9892 on WideSearch) and checks an installation end to end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from amapreduce.evaluation.loaders import gold_as_markdown, load_gold, load_tasks


def main(argv: list[str] | None = None) -> int:
    """Render every task's gold table to `<out>/<instance_id>.md`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", choices=["widesearch", "deepwidesearch"], default="widesearch")
    parser.add_argument("--tasks", type=Path, required=True)
    parser.add_argument("--gold-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    tasks = load_tasks(args.tasks, args.benchmark)
    args.out.mkdir(parents=True, exist_ok=True)
    for iid, task in tasks.items():
        (args.out / f"{iid}.md").write_text(
            gold_as_markdown(load_gold(args.gold_dir, task)), encoding="utf-8"
        )
    print(f"wrote {len(tasks)} answers to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
