"""Search backends as plug-ins: the `amapreduce.search_backends` entry-point group.

Each test installs a tiny package into a temporary folder on `sys.path`: a module with a backend
factory, and a `*.dist-info` whose `entry_points.txt` registers it, which is all `importlib.metadata`
reads. No network: the plug-in's backend answers from code, and the run's model is simulated
(deterministic code, not an LLM) behind the loopback OpenAI-compatible server.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from amapreduce.cli.app import main
from amapreduce.errors import ConfigError
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.settings import load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply, final_answer, tool_call
from amapreduce.web.backends import make_backend
from amapreduce.web.backends.registry import BUILTIN_BACKENDS, ENTRY_POINT_GROUP, available_backends

PLUGIN = '''
from amapreduce.web.backends import SearchBackend, SearchResult, backend_spec


class EchoBackend(SearchBackend):
    name = "echo"

    def __init__(self, prefix):
        self.prefix = prefix

    def search(self, query, n):
        return [SearchResult(rank=i, title=f"{self.prefix}-{query}-{i}", url=f"https://example.org/{self.prefix}/{i}",
                             snippet=f"hit {i} for {query}", source=self.name) for i in range(1, n + 1)]


@backend_spec("echo:PREFIX")
def make(arg, settings):
    """Echoes the query back (a test plug-in)."""
    return EchoBackend(arg)


def not_a_backend(arg, settings):
    return "a string"
'''


def install(site: Path, distribution: str, entry_points: dict[str, str], module: str | None = None,
            source: str = PLUGIN) -> None:
    """A minimal installed distribution in `site`: its METADATA, its entry points, its module."""
    info = site / f"{distribution.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n", encoding="utf-8")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}", encoding="utf-8")
    if module is not None:
        (site / f"{module}.py").write_text(source, encoding="utf-8")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on `sys.path` holding the `echo-search` plug-in; the working directory is fresh."""
    folder = tmp_path / "site"
    folder.mkdir()
    install(folder, "echo-search", {"echo": "amr_echo_plugin:make"}, module="amr_echo_plugin")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(tmp_path)
    yield folder
    for name in [m for m in sys.modules if m.startswith("amr_")]:
        del sys.modules[name]


def test_the_builtins_register_as_pyproject_declares(repo_root: Path) -> None:
    declared = tomllib.loads((repo_root / "pyproject.toml").read_text(encoding="utf-8"))
    assert declared["project"]["entry-points"][ENTRY_POINT_GROUP] == dict(BUILTIN_BACKENDS)
    entries = available_backends()
    assert [name for name in entries if entries[name].builtin] == list(BUILTIN_BACKENDS)
    assert [entries[n].spec() for n in BUILTIN_BACKENDS] == ["ddgs", "searxng[:URL]", "serper", "tavily", "corpus:INDEX"]


def test_list_backends_shows_the_plugin(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--list-backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["ddgs", "searxng[:URL]", "serper", "tavily", "corpus:INDEX", "echo:PREFIX"]
    assert re.search(r"echo:PREFIX\s+echo-search 1\.0\s+Echoes the query back", lines[-1])
    assert main(["search", "--list-backends", "--json"]) == 0
    listed = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert listed["echo"] == {
        "name": "echo", "spec": "echo:PREFIX", "builtin": False, "distribution": "echo-search", "version": "1.0",
        "description": "Echoes the query back (a test plug-in).", "entry_point": "amr_echo_plugin:make",
    }
    assert listed["ddgs"]["builtin"] is True


def test_search_uses_the_plugin(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "solar", "--backend", "echo:px", "-n", "2", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["title"] for r in results] == ["px-solar-1", "px-solar-2"]
    assert {r["source"] for r in results} == {"echo"}


def test_a_run_searches_with_the_plugin(site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`mapreduce run --search echo:px`: the sub-agents' `web_search` is the plug-in's backend."""

    def subagent(messages: list[Any], info: ModelInfo) -> Reply:
        text = "\n".join(message_text(m) for m in messages)
        asked = re.findall(r"Look up (\w+)\.", text.rsplit("Sub-questions:", 1)[-1])
        titles = dict(re.findall(r"\[px-(\w+)-1\]\((\S+?)\)", text))
        if any(word not in titles for word in asked):
            return [tool_call("web_search", query=word, n=1) for word in asked if word not in titles]
        return final_answer(json.dumps([{"task": k, "word": w, "url": titles[w]} for k, w in enumerate(asked, 1)]))

    decision = tmp_path / "words.json"
    decision.write_text(json.dumps({
        "task_matrix": [["alpha"], ["beta"]], "template": "Look up __0__.",
        "json_schema": {"type": "object", "properties": {"word": {}, "url": {}}},
        "batch_strategy": {"type": "per_atom", "rationale": "one word each"},
    }), encoding="utf-8")
    with OpenAICompatibleServer(FunctionModel(subagent, model_id="sim")) as server, allow_model_requests():
        code = main(["mapreduce", "run", str(decision), "--model", "sim", "--api-base", server.base_url,
                     "--search", "echo:px", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    table = json.loads(captured.out)["table_markdown"]
    assert "https://example.org/px/1" in table and "alpha" in table and "beta" in table


def test_unknown_or_misspelled_specs_list_the_plugins_too(site: Path) -> None:
    settings = load_settings({})
    for spec in ("bing", "echo", "ddgs:x", "corpus"):
        with pytest.raises(ConfigError, match=re.escape(
                f"unknown search backend {spec!r}. Use one of: ddgs | searxng[:URL] | serper | tavily | corpus:INDEX | "
                "echo:PREFIX.")):
            make_backend(spec, settings)


def test_clashing_broken_and_wrong_plugins_are_refused_with_their_package(
    site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    install(site, "echo-clone", {"echo": "amr_echo_plugin:make", "ddgs": "amr_echo_plugin:make"})
    install(site, "broken-search", {"broken": "amr_missing_module:make", "wrong": "amr_echo_plugin:not_a_backend"})
    settings = load_settings({})
    with pytest.raises(ConfigError, match=r"'echo' is registered by several packages \(echo-clone, echo-search\)"):
        make_backend("echo:px", settings)
    with pytest.raises(ConfigError, match=r"'broken' \(from broken-search\) cannot be loaded .*ModuleNotFoundError"):
        make_backend("broken", settings)
    with pytest.raises(ConfigError, match=r"'wrong' \(from broken-search\) returned str, not a SearchBackend"):
        make_backend("wrong", settings)
    # A plug-in cannot take a built-in's name: the built-in is built, the clash is shown.
    assert type(make_backend("ddgs", settings)).__name__ == "DdgsBackend"
    assert main(["search", "--list-backends"]) == 0
    out = capsys.readouterr().out
    assert "a plug-in of this name from echo-clone is ignored" in out
    assert "unusable: also registered by echo-search" in out
