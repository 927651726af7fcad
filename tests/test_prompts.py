"""The one prompt renderer: strict, read-only, exact; and the judge's official prompts sent byte for byte."""

from __future__ import annotations

import hashlib

import jinja2
import pytest

from amapreduce.errors import ConfigError
from amapreduce.prompts import prompt_names, prompts_dir, render_prompt

# sha256 of what the official str.format templates (WideSearch / DeepWideSearch metric_utils.py) produce
# for these inputs, taken from the upstream text before it moved to prompts/judge.yaml. Values with
# braces prove a value is inserted as it is, never read as a template.
OFFICIAL = {
    "key_align": ({"response": '["a {x}", "b"]', "reference": '["A", "B }}"]'},
                  "7a42a7167ebd79c41268503c0a9a02937e713b65c852e62c9a17af6f2ee5420a"),
    "column": ({"criterion": "same {meaning}", "response": '[{"idx": 0}]'},
               "987b425a100cf994d6df0cf9871e77932ee0f222cee47cb33130d4dc72f7bf89"),
    "entity": ({"question": "q?", "response": "r", "entity": "E {1}"},
               "0908eaf2854a191a73c2408baf9390056d8904141c0425fd011af80072409da2"),
}


@pytest.mark.parametrize("key", sorted(OFFICIAL))
def test_judge_prompts_render_exactly_what_the_official_scorer_sends(key: str) -> None:
    variables, digest = OFFICIAL[key]
    assert hashlib.sha256(render_prompt("judge", key, **variables).encode()).hexdigest() == digest


def test_a_missing_variable_fails_loudly() -> None:
    with pytest.raises(jinja2.UndefinedError, match="criterion"):
        render_prompt("judge", "column", response="[]")


def test_unknown_files_and_templates_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        render_prompt("no_such_file", "x")
    with pytest.raises(ConfigError, match="is not in prompts/judge.yaml"):
        render_prompt("judge", "no_such_template")


def test_every_prompt_file_lists_its_templates() -> None:
    files = sorted(p.stem for p in prompts_dir().glob("*.yaml"))
    assert {"judge", "manager", "mapreduce", "memory", "search_agent", "web"} <= set(files)
    for name in files:
        names = prompt_names(name)
        assert isinstance(names, tuple) and names, f"prompts/{name}.yaml defines no template"
