"""Command-line interface: `amapreduce` and its sub-commands."""
