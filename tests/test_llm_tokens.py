"""Token counts (`llm.tokens`, issue 12 point 4; design note `mapreduce-ensemble-tree-reduce.txt`
§8): the provider's usage first, else the offline tokenizer from LiteLLM's bundled files, else
chars/4 with exactly one warning. The suite refuses sockets, so every count here is offline.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from amapreduce.llm import tokens
from amapreduce.llm.tokens import TokenCounter, encoding_for_model
from amapreduce.llm.usage import Usage

LOGGER = "amapreduce.llm.tokens"


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test loads (or fails to load) the tokenizer itself and gets its own one warning."""
    monkeypatch.setattr(tokens, "_STATE", tokens._State())


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def test_provider_usage_is_preferred() -> None:
    counter = TokenCounter("gpt-4o")
    assert counter.of_reply("a reply of several words", Usage(output_tokens=42)) == 42


def test_without_usage_the_text_is_counted() -> None:
    counter = TokenCounter("gpt-4o")
    text = "12345678901234567890"
    assert counter.of_reply(text, None) == counter.count(text) == 7
    assert counter.of_reply(text, Usage(input_tokens=100, output_tokens=0)) == 7  # no completion count reported


def test_the_offline_tokenizer_gives_known_counts(caplog: pytest.LogCaptureFixture) -> None:
    """Counts the tokenizers are known for: digits go in groups of at most three (7 tokens for 20
    digits, where chars/4 says 5), and o200k spends fewer tokens than cl100k on Japanese."""
    before = os.environ.get("TIKTOKEN_CACHE_DIR")
    cl100k, o200k = TokenCounter("gpt-4"), TokenCounter("openai/gpt-4o-mini")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert cl100k.source == "tokenizer" and o200k.source == "tokenizer"
        assert cl100k.count("hello world") == 2
        assert cl100k.count("12345678901234567890") == 7
        assert cl100k.count("東京は日本の首都です。") == 11
        assert o200k.count("東京は日本の首都です。") == 8
        assert cl100k.count("") == 0
        assert cl100k.count("<|endoftext|>") > 1  # text, not a special token, and no error
    assert _warnings(caplog) == []
    assert os.environ.get("TIKTOKEN_CACHE_DIR") == before  # set for the load only


def test_model_ids_pick_the_encoding() -> None:
    for model in ("gpt-4o", "gpt-4o-mini", "openai/gpt-4.1", "gpt-5-nano", "o1", "o3-mini", "o4-mini"):
        assert encoding_for_model(model) == "o200k_base", model
    for other in (None, "", "gpt-4", "gpt-3.5-turbo", "anthropic/claude-sonnet-4", "omni-model", "simulated"):
        assert encoding_for_model(other) == "cl100k_base", other


def test_missing_files_fall_back_to_chars_over_four_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tokens, "_bundled_dir", lambda: tmp_path)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        first, second = TokenCounter("gpt-4"), TokenCounter("gpt-4o")
        assert first.count("12345678901234567890") == 5
        assert first.count("abcdefghi") == 3
        assert second.count("abcd") == 1  # the other encoding fails too: still one warning
        assert first.source == second.source == "chars/4"
        assert first.of_reply("abcdefgh", None) == 2
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "characters / 4" in warnings[0]


def test_without_tiktoken_the_fallback_is_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # `import tiktoken` now fails, as without the extra
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        counter = TokenCounter("gpt-4o")
        assert counter.count("12345678901234567890") == 5
        assert counter.source == "chars/4"
    assert len(_warnings(caplog)) == 1


def test_without_litellm_the_fallback_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_spec(name: str) -> None:
        return None

    monkeypatch.setattr(importlib.util, "find_spec", no_spec)
    assert TokenCounter().source == "chars/4"


def test_an_altered_file_is_never_given_to_tiktoken(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """tiktoken deletes a cached file that fails its hash and downloads a new one: a file that does
    not match must mean the fallback, before tiktoken is asked for anything."""
    import tiktoken

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("tiktoken must not be asked to load an unchecked file")

    altered = tokens._bundled_file(tmp_path, "cl100k_base")
    altered.write_bytes(b"not a BPE file\n")
    monkeypatch.setattr(tokens, "_bundled_dir", lambda: tmp_path)
    monkeypatch.setattr(tiktoken, "get_encoding", refuse)
    assert TokenCounter("gpt-4").count("abcdefgh") == 2
    assert altered.read_bytes() == b"not a BPE file\n"  # left alone


def test_the_bundled_files_are_found_without_importing_litellm() -> None:
    folder = tokens._bundled_dir()
    assert folder is not None and folder.name == "tokenizers"
    for name in ("cl100k_base", "o200k_base"):
        assert tokens._bundled_file(folder, name).is_file(), name
