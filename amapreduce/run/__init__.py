"""Running things end to end: run directories, wiring, progress, decision execution."""
