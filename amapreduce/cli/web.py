"""`amapreduce search|crawl|cache|corpus`: quick looks at the sub-agents' tools from a shell.

Only typer is imported at module level; the web stack loads inside each command so
`amapreduce --help` stays fast. With `--json`, stdout holds exactly one JSON document.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from amapreduce.cli.help import App

__all__ = ["register"]

cache_app = App(help="Inspect or clear the search/crawl cache.")
corpus_app = App(help="Build local corpus indexes.")


def _corpora(paths: list[Path] | None) -> dict[str, Path]:
    from amapreduce.web.corpus import CorpusIndex

    return {CorpusIndex.open(p).name: p for p in paths or []}


def _list_backends(as_json: bool) -> None:
    """Print every registered search backend: built-in, or from which installed package."""
    from amapreduce.web.backends.registry import available_backends

    entries = available_backends().values()
    if as_json:
        typer.echo(json.dumps([
            {"name": e.name, "spec": e.spec(), "builtin": e.builtin, "distribution": e.distribution,
             "version": e.version, "description": e.description(), "entry_point": e.value,
             **({"conflict": list(e.others)} if e.conflict else {}),
             **({"ignored": list(e.others)} if e.builtin and e.others else {})}
            for e in entries
        ], ensure_ascii=False))
        return
    for e in entries:
        source = "built-in" if e.builtin else f"{e.distribution} {e.version}".strip()
        note = ""
        if e.conflict:
            note = f"  [unusable: also registered by {', '.join(e.others)}]"
        elif e.others:
            note = f"  [a plug-in of this name from {', '.join(e.others)} is ignored]"
        typer.echo(f"{e.spec():<22} {source:<22} {e.description()}{note}".rstrip())


def search(
    query: Annotated[str | None, typer.Argument(help="What to search for.")] = None,
    backend: Annotated[str | None, typer.Option(
        "--backend", "--search", help="ddgs | searxng:URL | serper | tavily | corpus:INDEX, or an installed "
        "plug-in's NAME[:ARG] (see --list-backends; default: settings). --search is the same flag, named as "
        "on the run commands."
    )] = None,
    n: Annotated[int, typer.Option("-n", "--n", help="Number of results.")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of results.")] = False,
    list_backends: Annotated[bool, typer.Option(
        "--list-backends", help="List the search backends, built-in and from installed plug-ins, and exit."
    )] = False,
) -> None:
    """Search with one backend and print the ranked results (or list the backends)."""
    from amapreduce.settings import load_settings

    if list_backends:
        _list_backends(as_json)
        return
    if query is None:
        raise typer.BadParameter("give a QUERY to search for, or --list-backends.")
    from amapreduce.web.service import WebService
    from amapreduce.web.tools import format_results

    settings = load_settings()
    service = WebService.from_settings(settings, backend=backend)
    results = service.search(query, n)
    if as_json:
        typer.echo(json.dumps([r.model_dump(exclude_none=True) for r in results], ensure_ascii=False))
    else:
        typer.echo(format_results(query, results))


def crawl(
    url: Annotated[str, typer.Argument(help="An http(s) URL, or corpus://NAME/path with --corpus.")],
    allow_private_urls: Annotated[bool, typer.Option(
        "--allow-private-urls", help="Allow loopback/private addresses (never cloud metadata)."
    )] = False,
    max_chars: Annotated[int | None, typer.Option("--max-chars", help="Character budget of the text.")] = None,
    allow_domain: Annotated[list[str] | None, typer.Option(
        "--allow-domain", help="Fetch only this domain and its subdomains (repeatable; replaces "
        "AMAPREDUCE_ALLOWED_DOMAINS)."
    )] = None,
    deny_domain: Annotated[list[str] | None, typer.Option(
        "--deny-domain", help="Never fetch this domain or its subdomains (repeatable; replaces "
        "AMAPREDUCE_DENIED_DOMAINS)."
    )] = None,
    corpus: Annotated[list[Path] | None, typer.Option("--corpus", help="Corpus index for corpus:// URLs (repeatable).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the page as one JSON object.")] = False,
) -> None:
    """Fetch a page and print its extracted main text; a refused URL exits non-zero."""
    from amapreduce.settings import load_settings
    from amapreduce.web.service import WebService

    settings = load_settings(
        allow_private_urls=True if allow_private_urls else None,
        crawl_max_chars=max_chars,
        allowed_domains=",".join(allow_domain) if allow_domain else None,
        denied_domains=",".join(deny_domain) if deny_domain else None,
    )
    # The search backend is unused by a crawl, but a configured corpus backend makes its
    # corpus:// URLs readable without --corpus.
    backend = settings.search_backend if settings.search_backend.startswith("corpus:") else "ddgs"
    service = WebService.from_settings(settings, backend=backend, corpora=_corpora(corpus))
    page = service.crawl(url, settings.crawl_max_chars)
    if as_json:
        typer.echo(page.model_dump_json())
    else:
        if page.title and not page.text.lstrip().startswith("#"):
            typer.echo(f"# {page.title}\n")
        typer.echo(page.text)


@cache_app.command("stats")
def cache_stats(as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False) -> None:
    """Show the cache file, live entries per kind, expired entries and size."""
    from amapreduce.settings import load_settings
    from amapreduce.web.cache import WebCache

    settings = load_settings()
    stats = WebCache.in_dir(settings.cache_dir, settings.cache_ttl_s).stats()
    if as_json:
        typer.echo(stats.model_dump_json(exclude={"hits", "misses"}))
        return
    typer.echo(f"cache: {stats.path}")
    for kind, count in stats.entries.items() or [("(none)", 0)]:
        typer.echo(f"  {kind}: {count} live entries")
    typer.echo(f"  expired: {stats.expired}\n  size: {stats.bytes:,} bytes")


@cache_app.command("clear")
def cache_clear() -> None:
    """Delete every cached search result and page."""
    from amapreduce.settings import load_settings
    from amapreduce.web.cache import WebCache

    settings = load_settings()
    removed = WebCache.in_dir(settings.cache_dir, settings.cache_ttl_s).clear()
    typer.echo(f"removed {removed} cache entries")


@corpus_app.command("index")
def corpus_index(
    paths: Annotated[list[Path], typer.Argument(help="Folders (recursive) or files: .html .htm .xhtml .xml .md .txt")],
    out: Annotated[Path, typer.Option("--out", help="Index folder to write (replaced atomically).")],
    name: Annotated[str | None, typer.Option("--name", help="Index name in corpus://NAME/... (default: --out's name).")] = None,
    embeddings: Annotated[str | None, typer.Option(
        "--embeddings", help="Also embed documents for hybrid search: minilm | hashing[:DIM] | st:PATH.",
    )] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the manifest as JSON.")] = False,
) -> None:
    """Index folders of documents for `--search corpus:INDEX`."""
    import time

    from amapreduce.web.corpus import build_corpus_index

    start = time.perf_counter()
    manifest = build_corpus_index(paths, out, name=name, encoder=embeddings)
    if as_json:
        typer.echo(manifest.model_dump_json())
    else:
        typer.echo(f"indexed {manifest.documents} documents into {out} as corpus://{manifest.name}/ "
                   f"in {time.perf_counter() - start:.2f} s; search with --search corpus:{out}")


def register(app: typer.Typer) -> None:
    """Add `search` and `crawl` at the top level and the `cache` and `corpus` groups."""
    app.command("search")(search)
    app.command("crawl")(crawl)
    app.add_typer(cache_app, name="cache", help="Inspect or clear the search/crawl cache.")
    app.add_typer(corpus_app, name="corpus", help="Build local corpus indexes.")
