"""Local corpus index: files, titles, corpus:// URLs, search, lookup and safe rebuilds."""

from __future__ import annotations

from pathlib import Path

import pytest

from amapreduce.errors import ConfigError
from amapreduce.web.corpus import CorpusIndex, build_corpus_index, iter_corpus_files, split_corpus_url


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "paris.html").write_text(
        "<html><head><title>Paris guide</title></head><body><h1>Paris</h1>"
        "<p>Paris is the capital of France, on the Seine.</p></body></html>")
    (root / "sub" / "tokyo.md").write_text("# Tokyo notes\n\nTokyo is the capital of Japan.\n")
    (root / "berlin.txt").write_text("Berlin is the capital of Germany.\n")
    (root / "page.htm").write_text("<html><body><h2>No title tag</h2><p>Heading only document.</p></body></html>")
    (root / "image.png").write_bytes(b"\x89PNG")
    (root / ".hidden.txt").write_text("secret")
    return root


def test_index_titles_urls_and_search(docs: Path, tmp_path: Path) -> None:
    manifest = build_corpus_index([docs], tmp_path / "idx", name="demo")
    assert manifest.documents == 4
    index = CorpusIndex.open(tmp_path / "idx")
    assert index.search("Japan capital", 1)[0].url == "corpus://demo/sub/tokyo.md"
    top = index.search("Seine", 3)
    assert [(r.rank, r.title, r.url) for r in top] == [(1, "Paris guide", "corpus://demo/paris.html")]
    assert "Seine" in top[0].snippet
    assert index.search("Germany", 2)[0].title == "berlin.txt"
    doc = index.get("corpus://demo/page.htm")
    assert doc is not None and doc.title == "No title tag"
    assert index.get("corpus://demo/image.png") is None
    assert index.get("corpus://demo/.hidden.txt") is None


def test_hidden_folders_are_not_indexed(docs: Path, tmp_path: Path) -> None:
    for hidden in (".venv/lib/pkg", ".git", "sub/.cache"):
        (docs / hidden).mkdir(parents=True, exist_ok=True)
        (docs / hidden / "LICENSE.txt").write_text("Permission is hereby granted, free of charge")
    files = [rel for _, rel in iter_corpus_files([docs])]
    assert files == ["berlin.txt", "page.htm", "paris.html", "sub/tokyo.md"]
    assert build_corpus_index([docs], tmp_path / "idx", name="demo").documents == 4


def test_queries_with_syntax_characters_do_not_fail(docs: Path, tmp_path: Path) -> None:
    build_corpus_index([docs], tmp_path / "idx")
    index = CorpusIndex.open(tmp_path / "idx")
    assert index.search('title:"Paris" AND (capital OR -x) ^2 ~', 2)[0].url.endswith("paris.html")
    assert index.search("???", 3) == []


def test_default_name_is_the_folder_name(docs: Path, tmp_path: Path) -> None:
    assert build_corpus_index([docs / "berlin.txt"], tmp_path / "my-index").name == "my-index"
    assert CorpusIndex(tmp_path / "my-index").get("corpus://my-index/berlin.txt") is not None


def test_rebuild_replaces_and_invalidates_the_open_index(docs: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build_corpus_index([docs], out, name="demo")
    assert CorpusIndex.open(out).search("Germany", 3)
    (docs / "berlin.txt").unlink()
    build_corpus_index([docs], out, name="demo")
    assert not [r for r in CorpusIndex.open(out).search("Germany", 3) if r.url.endswith("berlin.txt")]
    assert not list(tmp_path.glob("idx.*"))  # no temp or old folders left behind


def test_refuses_to_overwrite_a_non_index_folder(docs: Path) -> None:
    with pytest.raises(ConfigError, match="not a corpus index"):
        build_corpus_index([docs], docs)


def test_bad_inputs(tmp_path: Path, docs: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        build_corpus_index([tmp_path / "missing"], tmp_path / "idx")
    with pytest.raises(ConfigError, match="invalid"):
        build_corpus_index([docs], tmp_path / "idx", name="bad name/")
    other = tmp_path / "other"
    other.mkdir()
    (other / "berlin.txt").write_text("duplicate path")
    with pytest.raises(ConfigError, match="two files map to"):
        build_corpus_index([docs, other], tmp_path / "idx")
    with pytest.raises(ConfigError, match="no corpus index"):
        CorpusIndex(tmp_path / "nothing")


def test_split_corpus_url() -> None:
    assert split_corpus_url("corpus://demo/a/b.html") == ("demo", "a/b.html")
    for bad in ("http://x/", "corpus://demo", "corpus:///x"):
        with pytest.raises(ConfigError):
            split_corpus_url(bad)


def test_hybrid_index_fuses_dense_hits_with_keyword_hits(tmp_path: Path) -> None:
    from amapreduce.web.hybrid import VECTORS_FILE, rrf_fuse

    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.txt").write_text("alpha alpha report on harbours")
    (root / "b.txt").write_text("beta notes about harbors and ports")
    (root / "c.txt").write_text("gamma unrelated cooking text")
    manifest = build_corpus_index([root], tmp_path / "idx", encoder="hashing:256")
    assert manifest.encoder == "hashing:256" and (tmp_path / "idx" / VECTORS_FILE).is_file()
    index = CorpusIndex(tmp_path / "idx")
    build_corpus_index([root], tmp_path / "kw")
    keyword_only = CorpusIndex(tmp_path / "kw")
    # "harbor" is a keyword hit for b only; the hashed character n-grams also pull in a ("harbours")
    assert [r.url for r in keyword_only.search("harbor", 3)] == ["corpus://kw/b.txt"]
    hybrid = [r.url for r in index.search("harbor", 3)]
    assert hybrid[:2] == ["corpus://idx/b.txt", "corpus://idx/a.txt"]
    assert [r.rank for r in index.search("harbor", 3)] == list(range(1, len(hybrid) + 1))
    assert rrf_fuse([["x", "y"], ["y", "z"]], 3) == ["y", "x", "z"]


def test_minilm_hybrid_finds_a_paraphrase_keyword_search_misses(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "cat.txt").write_text("The feline rested on the rug all afternoon.")
    (root / "stocks.txt").write_text("Stock markets fell sharply today after the announcement.")
    (root / "bread.txt").write_text("Recipe: bake the bread for forty minutes.")
    build_corpus_index([root], tmp_path / "kw")
    build_corpus_index([root], tmp_path / "hy", encoder="minilm")
    assert CorpusIndex(tmp_path / "kw").search("kitten carpet", 3) == []
    assert CorpusIndex(tmp_path / "hy").search("kitten carpet", 1)[0].url == "corpus://hy/cat.txt"


def test_a_failure_mid_build_leaves_the_old_index_and_no_temp_folder(
    docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import amapreduce.web.corpus as corpus

    out = tmp_path / "idx"
    build_corpus_index([docs], out, name="demo")
    calls = {"n": 0}
    real = corpus.extract_main_text

    def flaky(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk hiccup")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(corpus, "extract_main_text", flaky)
    with pytest.raises(OSError, match="disk hiccup"):
        build_corpus_index([docs], out, name="demo")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs", "idx"]
    assert CorpusIndex(out).search("Seine", 1)[0].url == "corpus://demo/paris.html"


def test_concurrent_searches_and_reads_agree(docs: Path, tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    build_corpus_index([docs], tmp_path / "idx", name="demo")
    index = CorpusIndex.open(tmp_path / "idx")
    expected = [r.url for r in index.search("capital", 4)]

    def work(i: int) -> tuple[list[str], bool]:
        doc = index.get("corpus://demo/sub/tokyo.md")
        return [r.url for r in index.search("capital", 4)], doc is not None and "Japan" in doc.text

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(work, range(400)))
    assert all(urls == expected and ok for urls, ok in outcomes)
