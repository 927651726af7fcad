"""Web-tools benchmark: corpus index build and query latency at 10k documents (tantivy, the engine
we ship, against bm25s measured in the same run), main-text extraction throughput on local pages,
and crawl throughput through a local HTTP server cold against cached.

Run: `.venv/bin/python benchmarks/bench_web.py` (add `--quick` for 2k documents, `--smoke` for 200
and 40 pages, the smallest run, which CI runs).
Figures are printed, not asserted; ratios compare against a baseline from the same run so they
survive a busy machine.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from amapreduce.sandbox import WORLD_DIR
from amapreduce.web.cache import WebCache
from amapreduce.web.corpus import CorpusIndex, build_corpus_index
from amapreduce.web.main_text import extract_main_text
from amapreduce.web.policy import UrlPolicy
from amapreduce.web.service import WebService

WORDS = [f"w{i}" for i in range(20_000)]


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _synthetic_docs(n: int, rng: random.Random) -> list[str]:
    # Zipf-like word frequencies, 40-160 words per document: a rough stand-in for short web pages.
    weights = [1.0 / (i + 1) for i in range(len(WORDS))]
    return [" ".join(rng.choices(WORDS, weights=weights, k=rng.randint(40, 160))) for _ in range(n)]


def bench_engines(docs: list[str], queries: list[str]) -> dict[str, float]:
    """Raw keyword-engine comparison on identical texts: build time and per-query latency."""
    import bm25s
    import tantivy

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        def build_tantivy() -> Any:
            schema = tantivy.SchemaBuilder()
            schema.add_text_field("body", stored=True, tokenizer_name="en_stem")
            index = tantivy.Index(schema.build(), path=tmp)
            writer = index.writer(heap_size=64_000_000, num_threads=1)
            for text in docs:
                writer.add_document(tantivy.Document(body=text))
            writer.commit()
            writer.wait_merging_threads()
            index.reload()
            return index

        out["tantivy_build_s"], index = _timed(build_tantivy)
        searcher = index.searcher()

        def query_tantivy() -> None:
            for q in queries:
                parsed, _ = index.parse_query_lenient(q, ["body"])
                searcher.search(parsed, limit=10)

        out["tantivy_query_ms"] = _timed(query_tantivy)[0] / len(queries) * 1000

    def build_bm25s() -> Any:
        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize(docs, stopwords="en", show_progress=False), show_progress=False)
        return retriever

    out["bm25s_build_s"], retriever = _timed(build_bm25s)

    def query_bm25s() -> None:
        for q in queries:
            retriever.retrieve(bm25s.tokenize([q], stopwords="en", show_progress=False), k=10, show_progress=False)

    out["bm25s_query_ms"] = _timed(query_bm25s)[0] / len(queries) * 1000
    return out


def bench_corpus(docs: list[str], queries: list[str]) -> dict[str, float]:
    """End to end: write .txt files, `build_corpus_index` (extraction included), `CorpusIndex.search`."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "docs"
        folder.mkdir()
        for i, text in enumerate(docs):
            (folder / f"d{i:05d}.txt").write_text(text)
        build_s, _ = _timed(lambda: build_corpus_index([folder], Path(tmp) / "idx", name="bench"))
        index = CorpusIndex.open(Path(tmp) / "idx")
        lat = []
        for q in queries:
            t, _ = _timed(lambda q=q: index.search(q, 10))
            lat.append(t * 1000)
    return {"corpus_build_s": build_s, "corpus_query_ms_median": statistics.median(lat),
            "corpus_query_ms_p95": sorted(lat)[int(len(lat) * 0.95) - 1]}


def bench_extraction(pages: list[bytes]) -> dict[str, float]:
    """trafilatura main-text extraction (what crawl_page does) against a flat text dump (baseline)."""
    import trafilatura

    full, _ = _timed(lambda: [extract_main_text(p, "text/html") for p in pages])
    flat, _ = _timed(lambda: [trafilatura.html2txt(p.decode("utf-8")) for p in pages])
    return {"pages": len(pages), "extract_pages_per_s": len(pages) / full, "html2txt_pages_per_s": len(pages) / flat}


def bench_crawl(pages: list[bytes]) -> dict[str, float]:
    """crawl_page's service path through a real local HTTP server: cold (fetch+extract) vs cached."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = pages[int(self.path.strip("/")) % len(pages)]
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    n = min(len(pages), 100)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            from amapreduce.web.backends.ddgs import DdgsBackend

            service = WebService(DdgsBackend(), cache=WebCache(Path(tmp) / "c.sqlite3", ttl_s=3600),
                                 policy=UrlPolicy(allow_private_urls=True))
            cold, _ = _timed(lambda: [service.crawl(f"{base}/{i}", 20_000) for i in range(n)])
            warm, _ = _timed(lambda: [service.crawl(f"{base}/{i}", 20_000) for i in range(n)])
            usage = service.usage()
    finally:
        httpd.shutdown()
        httpd.server_close()
    return {"crawl_cold_pages_per_s": n / cold, "crawl_cached_pages_per_s": n / warm,
            "cache_hits": usage.cache_hits, "cache_misses": usage.cache_misses}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2k documents instead of 10k")
    parser.add_argument("--smoke", action="store_true", help="200 documents, 40 pages: checks that it runs")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args(argv)
    rng = random.Random(7)
    n_docs = 200 if args.smoke else 2_000 if args.quick else 10_000
    docs = _synthetic_docs(n_docs, rng)
    queries = [" ".join(rng.choices(WORDS[:2000], k=3)) for _ in range(200)]
    pages = [p.read_bytes() for p in sorted((WORLD_DIR / "pages").rglob("*.html"))][: 40 if args.smoke else None]
    results: dict[str, Any] = {"documents": n_docs}
    results.update(bench_engines(docs, queries))
    results.update(bench_corpus(docs, queries))
    results.update(bench_extraction(pages))
    results.update(bench_crawl(pages))
    results["bm25s_over_tantivy_build"] = results["bm25s_build_s"] / results["tantivy_build_s"]
    results["bm25s_over_tantivy_query"] = results["bm25s_query_ms"] / results["tantivy_query_ms"]
    results["cached_over_cold_crawl"] = results["crawl_cached_pages_per_s"] / results["crawl_cold_pages_per_s"]
    if args.json:
        print(json.dumps(results))
        return 0
    r = results
    print(f"keyword engines, {n_docs:,} synthetic docs, 200 queries of 3 terms:")
    print(f"  tantivy: build {r['tantivy_build_s']:.2f} s, query {r['tantivy_query_ms']:.3f} ms")
    print(f"  bm25s:   build {r['bm25s_build_s']:.2f} s, query {r['bm25s_query_ms']:.3f} ms")
    print(f"  bm25s/tantivy: build x{r['bm25s_over_tantivy_build']:.1f}, query x{r['bm25s_over_tantivy_query']:.1f}")
    print(f"corpus index (files -> extraction -> tantivy): build {r['corpus_build_s']:.2f} s, "
          f"search median {r['corpus_query_ms_median']:.2f} ms, p95 {r['corpus_query_ms_p95']:.2f} ms")
    print(f"extraction on {r['pages']} sandbox pages: trafilatura {r['extract_pages_per_s']:.0f} pages/s, "
          f"html2txt baseline {r['html2txt_pages_per_s']:.0f} pages/s")
    print(f"crawl via local HTTP: cold {r['crawl_cold_pages_per_s']:.0f} pages/s, cached "
          f"{r['crawl_cached_pages_per_s']:.0f} pages/s (x{r['cached_over_cold_crawl']:.1f}; "
          f"hits {r['cache_hits']}, misses {r['cache_misses']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
