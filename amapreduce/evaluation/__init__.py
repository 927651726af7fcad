"""WideSearch / DeepWideSearch scoring that matches the official scorers (docs/scorer-rules.md).

Modules, in pipeline order: `answer` (markdown answer -> table, exactly as the official parser),
`loaders` (tasks jsonl, gold CSV, predictions), `preprocess` and `metrics` (cell rules),
`judges` (llm_judge columns, header/key alignment, entity check: stand-ins or models),
`score` (one table), `deepwide` (DeepWideSearch protocols), `summary` (Avg@N / Pass@N / Max@N),
`details` (per-row audit CSV), `runner` (many tasks x trials; behind `amapreduce eval score`) and
`report` with `report_data` and `report_plots` (`amapreduce eval report`: report.md and plots of an
`eval run` folder).

Nothing is imported here, so `import amapreduce.evaluation` stays cheap; pandas and dateparser
load only when a table is scored.
"""
