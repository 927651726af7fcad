"""Prompts of the memory model (projection Φ, contrastive refinement, merge), after paper App. D.7–D.8.

Kept as plain strings filled with `str.format`: the inputs are task text and hint text, never
templates, so there is nothing to inject into.
"""

from __future__ import annotations

__all__ = [
    "COMPARE_SYSTEM",
    "COMPARE_USER",
    "FULL_POOL_SUFFIX",
    "MERGE_SYSTEM",
    "MERGE_USER",
    "OPERATION_FORMAT",
    "PROJECT_SYSTEM",
    "PROJECT_USER",
    "SUCCESS_SYSTEM",
    "SUCCESS_USER",
]

PROJECT_SYSTEM = """You are a strategy assistant. You will be given the MapReduce inputs of a new task (task_matrix,
template, json_schema, batch_strategy) and a list of historical hints.
Produce NEW, task-specific guidance that says where the current batching decision can be improved and what to
adjust. Base it on BOTH the current inputs and the historical hints. Emphasise actionable levers (batch size,
grouping logic, schema/template constraints, source reuse, verification flow). Do not repeat the inputs verbatim
and do not invent facts.
Return no more than {max_bullets} insights, as a numbered list:
1. Insight 1
2. Insight 2"""

PROJECT_USER = """### Task
{query}

### Current MapReduce inputs
{decision}

### Agent's role
MapReduce batching strategist (efficiency and quality)

### Historical hints
{hints}

### Your output (at most {max_bullets} numbered insights for this task)"""

OPERATION_FORMAT = """Answer with operations only, one per line, in this format:
AGREE <EXISTING RULE NUMBER>: <EXISTING RULE>
REMOVE <EXISTING RULE NUMBER>: <EXISTING RULE>
EDIT <EXISTING RULE NUMBER>: <NEW MODIFIED RULE>
ADD: <NEW RULE>
AGREE if an existing rule is strongly relevant, REMOVE if it is contradicted or duplicated, EDIT if it is not
general enough or can be improved, ADD for a new rule very different from the existing ones and useful for other
tasks. Rules must be general (never mention these particular tasks or trials), concise and easy to follow. Do at
most {max_ops} operations, and at most one operation per existing rule."""

FULL_POOL_SUFFIX = """
The rule list is full: prefer REMOVE, EDIT or AGREE, and ADD only a rule that is VERY insightful and different."""

COMPARE_SYSTEM = """You are an advanced reasoning agent deriving structural batching insights for MapReduce-style
web tasks. Output procedural rules about how to plan a task, not about its content. Good rules cover:
1) task structure (independence, grouping, ordering, whether rows are atomic);
2) template-to-row mapping (what each row substitutes; how schema/template affect independence and context size);
3) batching strategy (per_atom / by_attr / open; chunk size; context reuse);
4) reliability and ordering (when grouping is mandatory; parallelism versus correctness).
Write short, transferable rules in natural language; no placeholders, schemas or dicts."""

COMPARE_USER = """## SUCCESSFUL decision (task: {pos_query})
{pos_pattern}

## WEAKER decision on a similar task (task: {neg_query})
{neg_pattern}

## EXISTING RULES
{rules}

By contrasting the successful and the weaker decision with the existing rules, propose operations to refine
the rule set.
{format}"""

SUCCESS_SYSTEM = """You are an advanced reasoning agent extracting structural batching insights from successful
MapReduce decisions. Focus on transferable rules about task decomposition, template-field mapping, batching
strategy (per_atom / by_attr / open, chunk size) and ordering/parallelism. Do not restate content or schemas."""

SUCCESS_USER = """## SUCCESSFUL decisions
{cases}

## EXISTING RULES
{rules}

Identify recurring batching, template and schema patterns that led to success. Keep rules general and concise.
{format}"""

MERGE_SYSTEM = """You merge overlapping batching hints for MapReduce tasks. Keep each merged hint actionable for
planning: task structure, template-to-row mapping, batching strategy (per_atom / by_attr / open and chunk size),
ordering and parallelism. Base every merged hint strictly on the given hints; add nothing new. Drop
content-level or placeholder-only hints. Start directly with a numbered list of concise rules."""

MERGE_USER = """## Current batching hints
{rules}

Consolidate them into no more than {limit} refined hints. Start directly with the numbered list."""
