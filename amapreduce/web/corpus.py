"""Local corpus: index folders of documents and search them like the web.

Why tantivy: measured on this machine (benchmarks/bench_web.py) it builds and queries a 10k-doc
index several times faster than bm25s, stores the documents itself (so `corpus://` URLs are read
back from the same index) and has no dependencies. Each document gets the URL
`corpus://<index name>/<path relative to the indexed folder>` and a title (HTML `<title>`, first
heading, or file name).

Layout of an index folder: `manifest.json` (name, document count, format) and `tantivy/`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from amapreduce.errors import ConfigError, RunError, storage_error
from amapreduce.web.main_text import extract_main_text
from amapreduce.web.models import SearchResult

__all__ = [
    "CORPUS_SCHEME",
    "FORMAT",
    "INDEXABLE_SUFFIXES",
    "CorpusDocument",
    "CorpusIndex",
    "CorpusManifest",
    "build_corpus_index",
    "corpus_url",
    "iter_corpus_files",
    "split_corpus_url",
]

CORPUS_SCHEME = "corpus://"
FORMAT = "amapreduce-corpus/1"
INDEXABLE_SUFFIXES: dict[str, str] = {
    ".html": "text/html", ".htm": "text/html", ".xhtml": "application/xhtml+xml", ".xml": "text/xml",
    ".md": "text/markdown", ".markdown": "text/markdown", ".txt": "text/plain",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_WORD = re.compile(r"\w+", re.UNICODE)
_OPEN: dict[Path, CorpusIndex] = {}
_OPEN_LOCK = threading.Lock()


class CorpusManifest(BaseModel):
    """`manifest.json` of an index folder."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str = FORMAT
    name: str
    engine: str = "tantivy"
    documents: int
    encoder: str | None = None
    """Embedding encoder of the optional dense side (`minilm`, `hashing:384` ...); None: keyword only."""


class CorpusDocument(BaseModel):
    """One indexed document, as read back by URL."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    title: str
    text: str


def corpus_url(name: str, relative: str) -> str:
    """`corpus://<name>/<relative posix path>`."""
    return f"{CORPUS_SCHEME}{name}/{relative.lstrip('/')}"


def split_corpus_url(url: str) -> tuple[str, str]:
    """(index name, relative path) of a `corpus://` URL.

    Raises:
        ConfigError: not a corpus URL, or no path.
    """
    if not url.startswith(CORPUS_SCHEME):
        raise ConfigError(f"not a corpus URL: {url!r}. Corpus URLs look like corpus://NAME/path.html.")
    name, _, rel = url[len(CORPUS_SCHEME):].partition("/")
    if not name or not rel:
        raise ConfigError(f"corpus URL {url!r} needs an index name and a path: corpus://NAME/path.html.")
    return name, rel


def iter_corpus_files(paths: Iterable[Path]) -> Iterator[tuple[Path, str]]:
    """(file, path relative to its indexed folder) for every indexable file, in sorted order.

    Hidden files and everything under hidden folders (`.git`, `.venv`, `.cache` ...) are skipped:
    indexing a project folder should index its documents, not vendored licences and VCS data.
    Hidden folders are pruned while walking, so a large `.venv` costs nothing.
    """
    for root in paths:
        root = Path(root)
        if root.is_file():
            yield root, root.name
            continue
        if not root.is_dir():
            raise ConfigError(f"cannot index {str(root)!r}: no such file or folder. Give existing folders.")
        found: list[Path] = []
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            found.extend(Path(folder, f) for f in files
                         if not f.startswith(".") and Path(f).suffix.lower() in INDEXABLE_SUFFIXES)
        for file in sorted(found):
            if file.is_file():
                yield file, file.relative_to(root).as_posix()


def _schema() -> Any:
    import tantivy

    builder = tantivy.SchemaBuilder()
    builder.add_text_field("url", stored=True, tokenizer_name="raw")
    builder.add_text_field("title", stored=True, tokenizer_name="en_stem")
    builder.add_text_field("body", stored=True, tokenizer_name="en_stem")
    builder.add_integer_field("row", stored=True, indexed=True)
    return builder.build()


def _replace_dir(tmp: Path, out: Path) -> None:
    """Swap a freshly built index folder into place (rename is atomic; the old one is removed after)."""
    old = out.with_name(out.name + f".old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    if old.exists():
        shutil.rmtree(old)


def build_corpus_index(
    paths: Iterable[Path], out: Path, *, name: str | None = None, encoder: str | None = None
) -> CorpusManifest:
    """Index every .html/.htm/.xhtml/.xml/.md/.txt file under `paths` into the folder `out`.

    Args:
        paths: folders (indexed recursively) or single files.
        out: the index folder; replaced atomically if it already holds an index.
        name: the index name used in `corpus://NAME/...` URLs (default: `out`'s folder name).
        encoder: also store sentence embeddings with this encoder (`minilm`, `hashing:384`,
            `st:PATH`) so searches fuse keyword and dense rankings; None: keyword only.

    Raises:
        ConfigError: bad name, missing input, `out` is a non-index folder, or two files map to one URL.
    """

    out = Path(out)
    index_name = name or out.name
    if not _NAME.match(index_name):
        raise ConfigError(f"corpus index name {index_name!r} is invalid. Use letters, digits, `.`, `_`, `-`.")
    if out.exists() and not (out / "manifest.json").is_file() and any(out.iterdir()):
        raise ConfigError(f"{str(out)!r} exists and is not a corpus index; refusing to overwrite it. "
                          "Choose an empty or new --out folder.")
    # Inputs are listed and checked before any index exists, so a bad path or a URL clash
    # fails fast and leaves nothing behind.
    files: list[tuple[Path, str]] = []
    seen: set[str] = set()
    for file, rel in iter_corpus_files(paths):
        url = corpus_url(index_name, rel)
        if url in seen:
            raise ConfigError(f"two files map to {url!r}; index those folders separately.")
        seen.add(url)
        files.append((file, url))
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}-{threading.get_ident()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        _write_index(tmp, files, index_name, encoder)
        out.parent.mkdir(parents=True, exist_ok=True)
        _replace_dir(tmp, out)
    except ValueError as exc:  # tantivy reports its file-system errors as ValueError("An IO error occurred: ...")
        fault = _index_io_error(exc, tmp)
        if fault is None:
            raise
        raise storage_error(fault, then=f"run the command again (the corpus index {str(out)!r} was not changed)") from exc
    except OSError as exc:
        raise storage_error(exc, then=f"run the command again (the corpus index {str(out)!r} was not changed)") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    with _OPEN_LOCK:
        _OPEN.pop(out.resolve(), None)
    return CorpusManifest(name=index_name, documents=len(files), encoder=encoder)


_TANTIVY_IO = re.compile(r"An IO error occurred.*?\(os error (\d+)\)(?: at path \"([^\"]*)\")?", re.DOTALL)


def _index_io_error(exc: ValueError, folder: Path) -> OSError | None:
    """The `OSError` inside tantivy's `ValueError` for a failed file operation (its `os error N`
    and path), or None when `exc` is not one."""
    found = _TANTIVY_IO.search(str(exc))
    if found is None:
        return None
    number = int(found.group(1))
    return OSError(number, os.strerror(number), found.group(2) or str(folder))


def _write_index(tmp: Path, files: list[tuple[Path, str]], index_name: str, encoder: str | None) -> None:
    """Build the whole index (tantivy, vectors, manifest) in the folder `tmp`."""
    import tantivy

    (tmp / "tantivy").mkdir(parents=True)
    index = tantivy.Index(_schema(), path=str(tmp / "tantivy"))
    writer = index.writer(heap_size=64_000_000, num_threads=1)
    dense_texts: list[str] = []
    try:
        for file, url in files:
            content_type = INDEXABLE_SUFFIXES[file.suffix.lower()]
            title, text = extract_main_text(file.read_bytes(), content_type, url=url)
            writer.add_document(tantivy.Document(url=url, title=title or file.name, body=text, row=len(dense_texts)))
            dense_texts.append(f"{title}\n{text}")
        writer.commit()
    except BaseException:
        writer.rollback()  # stop tantivy's threads before the folder is deleted
        raise
    finally:
        writer.wait_merging_threads()
    if encoder is not None:
        from amapreduce.web.hybrid import embed_documents, save_vectors

        save_vectors(tmp, embed_documents(encoder, dense_texts))
    manifest = CorpusManifest(name=index_name, documents=len(files), encoder=encoder)
    (tmp / "manifest.json").write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")


def _snippet(text: str, terms: set[str], limit: int = 240) -> str:
    """The line that mentions the most query terms (ties: earliest), cut to `limit` chars."""
    best, best_score = "", -1
    for line in text.splitlines():
        stripped = line.strip(" |#-")
        if not stripped:
            continue
        score = len(terms & {w.lower() for w in _WORD.findall(stripped)})
        if score > best_score:
            best, best_score = stripped, score
    best = " ".join(best.split())
    return best if len(best) <= limit else best[: limit - 1].rstrip() + "…"


class CorpusIndex:
    """An opened corpus index: BM25 search over titles and bodies, and lookup by URL."""

    def __init__(self, path: Path) -> None:
        import tantivy

        self.path = Path(path)
        manifest_file = self.path / "manifest.json"
        try:
            self.manifest = CorpusManifest.model_validate_json(manifest_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"no corpus index at {str(self.path)!r}. Build one with "
                              "`amapreduce corpus index FOLDER --out INDEX`.") from None
        except (ValidationError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{str(manifest_file)!r} is not a valid corpus manifest: {exc}. Rebuild the index.") from None
        if self.manifest.format != FORMAT:
            raise ConfigError(f"corpus index {str(self.path)!r} has format {self.manifest.format!r}, "
                              f"expected {FORMAT!r}. Rebuild it.")
        try:
            self._index = tantivy.Index.open(str(self.path / "tantivy"))
            self._index.reload()
        except ValueError as exc:
            raise RunError(f"cannot open corpus index {str(self.path)!r}: {exc}. Rebuild it.") from exc
        self._vectors: Any = None
        if self.manifest.encoder is not None:
            from amapreduce.web.hybrid import load_vectors

            self._vectors = load_vectors(self.path)

    @classmethod
    def open(cls, path: Path) -> CorpusIndex:
        """Open (once per process) the index at `path`."""
        key = Path(path).resolve()
        with _OPEN_LOCK:
            found = _OPEN.get(key)
            if found is None:
                found = _OPEN[key] = cls(key)
            return found

    @property
    def name(self) -> str:
        return self.manifest.name

    def search(self, query: str, n: int = 5) -> list[SearchResult]:
        """The `n` best documents for `query`: BM25 (title matches weigh 2×), fused with dense
        similarity by reciprocal rank when the index has embeddings."""
        import tantivy

        terms = _WORD.findall(query.lower())
        if not terms or n < 1:
            return []
        parsed, _errors = self._index.parse_query_lenient(
            " ".join(terms), ["title", "body"], field_boosts={"title": 2.0}
        )
        searcher = self._index.searcher()
        if self._vectors is None:
            docs = [searcher.doc(address) for _score, address in searcher.search(parsed, limit=n).hits]
        else:
            from amapreduce.web.hybrid import dense_rank, rrf_fuse

            depth = max(4 * n, 20)
            keyword = [searcher.doc(a) for _s, a in searcher.search(parsed, limit=depth).hits]
            by_row = {int(d["row"][0]): d for d in keyword}
            dense_rows = dense_rank(str(self.manifest.encoder), self._vectors, query, depth)
            fused = rrf_fuse([[str(r) for r in by_row], [str(r) for r in dense_rows]], n)
            docs = []
            for key in fused:
                row = int(key)
                if row not in by_row:
                    hits = searcher.search(tantivy.Query.term_query(self._index.schema, "row", row), limit=1).hits
                    by_row[row] = searcher.doc(hits[0][1])
                docs.append(by_row[row])
        return [
            SearchResult(rank=i, title=str(doc["title"][0]), url=str(doc["url"][0]),
                         snippet=_snippet(str(doc["body"][0]), set(terms)), source=f"corpus:{self.name}")
            for i, doc in enumerate(docs, 1)
        ]

    def get(self, url: str) -> CorpusDocument | None:
        """The document stored under `url`, or None."""
        import tantivy

        query = tantivy.Query.term_query(self._index.schema, "url", url)
        searcher = self._index.searcher()
        hits = searcher.search(query, limit=1).hits
        if not hits:
            return None
        doc = searcher.doc(hits[0][1])
        return CorpusDocument(url=url, title=str(doc["title"][0]), text=str(doc["body"][0]))

    def __len__(self) -> int:
        return self.manifest.documents

