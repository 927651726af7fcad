"""Parsing the memory model's replies: lists and ADD/EDIT/REMOVE/AGREE, mapped to the right hint."""

from __future__ import annotations

from amapreduce.memory.parsing import map_operations, parse_list, parse_operations

LISTED = [("h1", "Use per_atom batching when rows are independent."),
          ("h2", "Group entities that share a source page into one batch."),
          ("h3", "Keep the template free of content-specific wording.")]


def test_list_parser_accepts_numbers_bullets_and_continuations() -> None:
    reply = "Here you go:\n1. First rule\n   continues here.\n2) Second rule\n- **Third rule**\n\n# heading\n"
    assert parse_list(reply) == ["First rule continues here.", "Second rule", "Third rule"]
    assert parse_list(reply, limit=2) == ["First rule continues here.", "Second rule"]
    assert parse_list("no list at all") == []


def test_operation_parser_accepts_common_formatting_variants() -> None:
    reply = "\n".join([
        "AGREE 1: Use per_atom batching when rows are independent.",
        "**EDIT 2**: Group entities sharing one source page into one batch",
        "- REMOVE 3: Keep the template free of content-specific wording.",
        "ADD 7: Rule: Verify counts before writing the final table",
        "1. add: Prefer by_attr when an attribute is shared by many rows.",
        "Some commentary that is not an operation.",
        "EDIT 1:",
    ])
    ops, rejected = parse_operations(reply)
    assert [(o.op, o.number, o.text) for o in ops] == [
        ("AGREE", 1, "Use per_atom batching when rows are independent."),
        ("EDIT", 2, "Group entities sharing one source page into one batch"),
        ("REMOVE", 3, "Keep the template free of content-specific wording."),
        ("ADD", None, "Verify counts before writing the final table"),
        ("ADD", None, "Prefer by_attr when an attribute is shared by many rows."),
    ]
    assert [r.reason for r in rejected] == ["EDIT without rule text"]


def test_numbers_map_to_the_listed_hint() -> None:
    ops, _ = parse_operations("EDIT 3: Keep templates generic.\nREMOVE 1: x")
    mapped, rejected = map_operations(ops, LISTED, max_ops=4)
    assert [(o.op, o.hint_id) for o in mapped] == [("EDIT", "h3"), ("REMOVE", "h1")]
    assert rejected == []


def test_agree_never_credits_a_wrong_hint() -> None:
    # The reference credited the *last* hint when the text matched nothing; here:
    ops, _ = parse_operations("\n".join([
        "AGREE 9: Something not in the list.",              # number out of range
        "AGREE: Something not in the list either.",          # no number, no exact text
        "AGREE 1: Group entities that share a source page into one batch.",  # quotes hint 2 under number 1
        "AGREE: Keep the template free of content-specific wording.",       # no number, exact text of hint 3
    ]))
    mapped, rejected = map_operations(ops, LISTED, max_ops=10)
    assert [(o.op, o.hint_id) for o in mapped] == [("AGREE", "h3")]
    assert [r.reason for r in rejected] == [
        "hint number 9 is not in the list of 3", "AGREE names no listed hint", "AGREE 1 quotes hint 2, not 1"]


def test_at_most_max_ops_and_one_operation_per_hint() -> None:
    ops, _ = parse_operations("AGREE 1: a\nEDIT 1: b\nADD: c\nADD: d\nADD: e\nADD: f")
    mapped, rejected = map_operations(ops, LISTED, max_ops=4)
    assert [(o.op, o.text) for o in mapped] == [("AGREE", "a"), ("ADD", "c"), ("ADD", "d"), ("ADD", "e")]
    assert [r.reason for r in rejected] == ["hint 1 already has an operation", "more than 4 operations"]


def test_numbered_operations_with_an_empty_list_are_rejected() -> None:
    ops, _ = parse_operations("REMOVE 1: x\nADD: keep rows atomic.")
    mapped, rejected = map_operations(ops, [], max_ops=4)
    assert [o.op for o in mapped] == ["ADD"] and len(rejected) == 1
