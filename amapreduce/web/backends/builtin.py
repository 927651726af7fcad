"""The built-in search backends' factories, registered like any plug-in's.

Each is named in pyproject.toml's `[project.entry-points."amapreduce.search_backends"]` table and
in `registry.BUILTIN_BACKENDS`, and is called as `factory(arg, settings)` with the text after the
spec's first `:` (empty when there is none). A remote backend gets the settings' rate limit and
the `search_breaker_*` circuit breaker. Backend modules (and their client libraries) are imported
only when their backend is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from amapreduce.errors import ConfigError
from amapreduce.web.backends.base import search_breaker_policy
from amapreduce.web.backends.registry import backend_spec

if TYPE_CHECKING:
    from amapreduce.settings import Settings
    from amapreduce.web.backends.base import SearchBackend

__all__ = ["corpus", "ddgs", "searxng", "serper", "tavily"]


@backend_spec("ddgs")
def ddgs(arg: str, settings: Settings) -> SearchBackend:
    """The free default: DuckDuckGo and friends through the `ddgs` library, no key."""
    from amapreduce.web.backends.ddgs import DdgsBackend

    return DdgsBackend(min_interval_s=settings.search_min_interval_s, breaker=search_breaker_policy(settings))


@backend_spec("searxng[:URL]")
def searxng(arg: str, settings: Settings) -> SearchBackend:
    """A SearXNG instance's JSON API (URL, or AMAPREDUCE_SEARXNG_URL)."""
    from amapreduce.web.backends.searxng import SearxngBackend

    url = arg or settings.searxng_url
    if not url:
        raise ConfigError("backend `searxng` needs a URL: use `searxng:http://host:8888` "
                          "or set AMAPREDUCE_SEARXNG_URL.")
    return SearxngBackend(url, min_interval_s=settings.search_min_interval_s, breaker=search_breaker_policy(settings))


def _key(name: str, settings: Settings) -> str:
    key = settings.serper_api_key if name == "serper" else settings.tavily_api_key
    if key is None or not key.get_secret_value():
        env = name.upper() + "_API_KEY"
        raise ConfigError(f"backend `{name}` needs an API key, got none. Set {env} (or AMAPREDUCE_{env}), "
                          "or use the free default `--search ddgs`.")
    return key.get_secret_value()


@backend_spec("serper")
def serper(arg: str, settings: Settings) -> SearchBackend:
    """Google results through serper.dev (SERPER_API_KEY)."""
    from amapreduce.web.backends.serper import SerperBackend

    return SerperBackend(_key("serper", settings), min_interval_s=settings.search_min_interval_s,
                         breaker=search_breaker_policy(settings))


@backend_spec("tavily")
def tavily(arg: str, settings: Settings) -> SearchBackend:
    """Tavily's search API (TAVILY_API_KEY)."""
    from amapreduce.web.backends.tavily import TavilyBackend

    return TavilyBackend(_key("tavily", settings), min_interval_s=settings.search_min_interval_s,
                         breaker=search_breaker_policy(settings))


@backend_spec("corpus:INDEX")
def corpus(arg: str, settings: Settings) -> SearchBackend:
    """A local index built by `amapreduce corpus index`: offline, no rate limit."""
    from amapreduce.web.backends.corpus import CorpusBackend

    return CorpusBackend(Path(arg))
