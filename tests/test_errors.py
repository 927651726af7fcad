"""The exception tree: every class pickles with its structured fields, and the tree is one tree."""

from __future__ import annotations

import pickle

import pytest

import amapreduce.errors as errors


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_pickles_with_fields(name: str) -> None:
    cls = getattr(errors, name)
    exc = cls("what went wrong", batch_id="batch-007", attempt=2)
    clone = pickle.loads(pickle.dumps(exc))
    assert type(clone) is cls
    assert str(clone) == "what went wrong"
    assert clone.batch_id == "batch-007"
    assert clone.attempt == 2
    assert clone.fields == {"batch_id": "batch-007", "attempt": 2}


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_subclasses_the_base(name: str) -> None:
    assert issubclass(getattr(errors, name), errors.AmapreduceError)


def test_audiences_are_split() -> None:
    assert issubclass(errors.DecisionError, errors.UserError)
    assert issubclass(errors.ConfigError, errors.UserError)
    assert issubclass(errors.BatchTimeout, errors.RunError)
    assert not issubclass(errors.ToolCallRefused, (errors.UserError, errors.RunError))
    assert issubclass(errors.ToolCallRefused, errors.ToolError) and issubclass(errors.ToolCallFailed, errors.ToolError)
    assert not issubclass(errors.ToolError, (errors.UserError, errors.RunError))
    assert not issubclass(errors.ToolCallFailed, errors.ToolCallRefused)


def test_find_cause_stops_on_a_cause_chain_that_loops() -> None:
    from amapreduce.errors import find_cause

    first, second = ValueError("a"), KeyError("b")
    first.__cause__, second.__cause__ = second, first
    assert find_cause(first, TypeError) is None
    assert find_cause(first, KeyError) is second
