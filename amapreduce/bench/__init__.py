"""Benchmarks end to end: `eval run`'s trials of the whole pipeline, their scoring through the one
scoring path (`evaluation.runner`), the App. D.5 memory protocol and its commits, the evaluation's
journal and resume, and `memory learn` from a finished run."""
