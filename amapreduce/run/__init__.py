"""Running things end to end: the run lifecycle and directories, wiring, progress, `ask` and `mapreduce run`."""
