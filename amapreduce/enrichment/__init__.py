"""Enrich a list the user already has: its rows become the task matrix, the asked columns the schema.

`read_list` reads the file (`enrichment.listfile`), `EnrichRequest.of` checks it against what is asked
and makes the decision (`enrichment.request`), `run_enrichment` runs it as one `Session` of kind
`enrich` (`enrichment.run`), and `enriched_frame` puts the found cells back beside the user's rows, in
their order, none left out (`enrichment.output`). `amapreduce enrich` and `amapreduce.enrich` use them.
"""

from amapreduce.enrichment.listfile import LIST_FORMATS, read_list, write_list
from amapreduce.enrichment.output import enriched_frame, row_counts
from amapreduce.enrichment.request import ROW_STATUS_COLUMN, EnrichRequest, parse_columns
from amapreduce.enrichment.run import (
    ENRICH_FILE,
    ENRICHED_FILE,
    Enrichment,
    resumed_enrichment,
    run_enrichment,
)

__all__ = [
    "ENRICHED_FILE",
    "ENRICH_FILE",
    "LIST_FORMATS",
    "ROW_STATUS_COLUMN",
    "EnrichRequest",
    "Enrichment",
    "enriched_frame",
    "parse_columns",
    "read_list",
    "resumed_enrichment",
    "row_counts",
    "run_enrichment",
    "write_list",
]
