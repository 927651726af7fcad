"""`amapreduce search|crawl|cache|corpus` through `main([...])`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_web_fetch import ARTICLE, LocalServer, send

from amapreduce.cli.app import main
from amapreduce.sandbox import sandbox_world


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("AMAPREDUCE_SEARCH_BACKEND", "AMAPREDUCE_ALLOW_PRIVATE_URLS", "SERPER_API_KEY",
                "AMAPREDUCE_SERPER_API_KEY", "AMAPREDUCE_CACHE_TTL_S", "AMAPREDUCE_CRAWL_MAX_CHARS",
                "AMAPREDUCE_ALLOWED_DOMAINS", "AMAPREDUCE_DENIED_DOMAINS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AMAPREDUCE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return sandbox_world(tmp_path_factory.mktemp("sbx"))


def test_search_json_on_the_sandbox_corpus(world: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "Brazil population capital", "--backend", f"corpus:{world.index_dir}", "-n", "3",
                 "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert len(results) == 3
    assert [r["rank"] for r in results] == [1, 2, 3]
    assert {"rank", "title", "url", "snippet"} <= set(results[0])
    assert results[0]["url"] == "corpus://sandbox/countries/br.html"


def test_search_text_output(world: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "Kenya", "--backend", f"corpus:{world.index_dir}", "-n", "1"]) == 0
    assert capsys.readouterr().out.startswith("1. [Kenya — Sandbox Atlas](corpus://sandbox/countries/ke.html)")


def test_search_takes_the_run_commands_flag_name_too(world: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "Kenya", "--search", f"corpus:{world.index_dir}", "-n", "1"]) == 0
    assert capsys.readouterr().out.startswith("1. [Kenya — Sandbox Atlas](corpus://sandbox/countries/ke.html)")


def test_search_with_missing_key_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "x", "--backend", "serper"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SERPER_API_KEY" in err and "Traceback" not in err


def test_crawl_local_server_json(capsys: pytest.CaptureFixture[str]) -> None:
    with LocalServer({"/page": send(body=ARTICLE)}) as srv:
        code = main(["crawl", srv.url + "/page", "--allow-private-urls", "--max-chars", "5000", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    page = json.loads(out)
    assert page["title"] == "Local Test Page" and "| Population | 1,234,567 |" in page["text"]
    assert out.count("\n") == 1  # exactly one JSON document


def test_crawl_refused_url_exits_nonzero_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with LocalServer({"/page": send(body=ARTICLE)}) as srv:
        code = main(["crawl", srv.url + "/page"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and "loopback" in err
    assert srv.requests == []
    assert main(["crawl", "http://169.254.169.254/", "--allow-private-urls"]) != 0
    assert "metadata" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["http://[::1/", "http://example.com:99999/"])
def test_crawl_malformed_url_is_one_line_not_a_traceback(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crawl", url]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refused URL" in err and "Traceback" not in err


def test_crawl_domain_lists_from_flags_and_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with LocalServer({"/page": send(body=ARTICLE)}) as srv:
        base = ["crawl", srv.url + "/page", "--allow-private-urls"]
        assert main([*base, "--allow-domain", "example.com"]) == 1  # an IP-literal host is not on the list
        assert "not on the allow list (example.com)" in capsys.readouterr().err
        assert main([*base, "--allow-domain", "example.com", "--allow-domain", "127.0.0.1", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["title"] == "Local Test Page"
        monkeypatch.setenv("AMAPREDUCE_DENIED_DOMAINS", "example.org, 127.0.0.1")
        assert main(base) == 1
        assert "deny list" in capsys.readouterr().err
        assert main([*base, "--deny-domain", "example.org", "--json"]) == 0  # the flag replaces the variable
    assert len(srv.requests) == 1  # the second success is a cache hit, re-checked by the current lists


def test_crawl_corpus_url_and_text_output(world: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crawl", "corpus://sandbox/countries/fr.html", "--corpus", str(world.index_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# France\n") and "| Capital | Paris |" in out


def test_cache_stats_and_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with LocalServer({"/page": send(body=ARTICLE)}) as srv:
        assert main(["crawl", srv.url + "/page", "--allow-private-urls", "--json"]) == 0
    capsys.readouterr()
    assert main(["cache", "stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["entries"] == {"page": 1} and stats["path"].startswith(str(tmp_path))
    assert main(["cache", "clear"]) == 0
    assert "removed 1 cache entries" in capsys.readouterr().out
    assert main(["cache", "stats"]) == 0
    assert "(none)" in capsys.readouterr().out


def test_corpus_index_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Alpha\n\nAlpha is about aardvarks.\n")
    (docs / "b.txt").write_text("Beta is about bees.\n")
    assert main(["corpus", "index", str(docs), "--out", str(tmp_path / "idx"), "--name", "notes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["documents"] == 2
    assert main(["search", "bees", "--backend", f"corpus:{tmp_path / 'idx'}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["url"] == "corpus://notes/b.txt"
    assert main(["corpus", "index", str(tmp_path / "nope"), "--out", str(tmp_path / "i2")]) == 2
