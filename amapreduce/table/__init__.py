"""The reduced table: rows keyed by key columns, per-cell status, renderers."""
