"""Search backends as plug-ins: the `amapreduce.search_backends` entry-point group.

A package adds a backend by naming a factory in its own metadata::

    # the plug-in's pyproject.toml
    [project.entry-points."amapreduce.search_backends"]
    mysearch = "mysearch_amapreduce:make_backend"

    # mysearch_amapreduce.py
    from amapreduce.web.backends import SearchBackend, SearchResult, backend_spec

    @backend_spec("mysearch[:URL]")           # how the spec is written: optional, for listings and checks
    def make_backend(arg, settings):          # arg: the text after `mysearch:` ("" when none)
        return MySearchBackend(arg or "https://...")

`--search mysearch:https://...` (and `amapreduce search --backend ...`) then builds it, and
`amapreduce search --list-backends` lists it with the distribution it came from. The factory gets
the run's `Settings` (rate limit, breaker policy, keys) and returns a `SearchBackend`; a remote
one may subclass `RemoteBackend` for the shared retries, rate limit and circuit breaker.

The built-in backends register the same way: pyproject.toml declares them in the same group, and
`BUILTIN_BACKENDS` is that table, so a source checkout whose installed metadata is stale still
has them (tests/test_search_plugins.py checks the two agree). A plug-in cannot replace a built-in
name (it is listed as ignored); two plug-ins registering one name make that name an error naming
both, rather than one of them winning by install order.

`backend_spec` says how a spec is written: `NAME` takes no argument, `NAME[:ARG]` an optional
one, `NAME:ARG` a required one; a spec that does not fit is refused with the list of backends,
as an unknown name is. A factory without one accepts any argument.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import import_module, metadata
from typing import TYPE_CHECKING, Protocol, TypeVar

from amapreduce._version import __version__
from amapreduce.errors import ConfigError
from amapreduce.web.backends.base import SearchBackend

if TYPE_CHECKING:
    from amapreduce.settings import Settings

__all__ = [
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "BackendEntry",
    "BackendFactory",
    "available_backends",
    "backend_spec",
    "backend_specs",
    "make_backend",
]

ENTRY_POINT_GROUP = "amapreduce.search_backends"

BUILTIN_BACKENDS: Mapping[str, str] = {
    "ddgs": "amapreduce.web.backends.builtin:ddgs",
    "searxng": "amapreduce.web.backends.builtin:searxng",
    "serper": "amapreduce.web.backends.builtin:serper",
    "tavily": "amapreduce.web.backends.builtin:tavily",
    "corpus": "amapreduce.web.backends.builtin:corpus",
}
"""The built-in backends' entry points, as pyproject.toml declares them."""

_OWN_DISTRIBUTION = "amapreduce"


class BackendFactory(Protocol):
    """What an entry point names: builds a backend from the spec's argument and the settings."""

    def __call__(self, arg: str, settings: Settings, /) -> SearchBackend:
        """Raise `ConfigError` when `arg` or the settings cannot make a backend (a missing key)."""
        ...


F = TypeVar("F", bound=Callable[..., object])


def backend_spec(spec: str) -> Callable[[F], F]:
    """Mark a factory with how its spec is written (`NAME`, `NAME[:ARG]` or `NAME:ARG`)."""

    def mark(factory: F) -> F:
        setattr(factory, "spec", spec)  # noqa: B010  # a function attribute that mypy cannot see declared
        return factory

    return mark


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True, kw_only=True)
class BackendEntry:
    """One registered backend: where its factory is and which distribution registered it."""

    name: str
    value: str
    """The entry point's `module:attribute`."""
    distribution: str
    """The distribution that registered it (`amapreduce` for a built-in)."""
    version: str = ""
    others: tuple[str, ...] = ()
    """Other distributions registering the same name: ignored for a built-in, a conflict otherwise."""

    @property
    def builtin(self) -> bool:
        """Whether amapreduce itself provides it."""
        return self.distribution == _OWN_DISTRIBUTION

    @property
    def conflict(self) -> bool:
        """Whether two plug-ins register this name (it cannot be used until one is uninstalled)."""
        return bool(self.others) and not self.builtin

    def load(self) -> BackendFactory:
        """Import the factory.

        Raises:
            ConfigError: the name is registered twice, or the plug-in cannot be imported.
        """
        if self.conflict:
            owners = ", ".join([self.distribution, *self.others])
            raise ConfigError(f"search backend {self.name!r} is registered by several packages ({owners}); "
                              "uninstall all but one of them.")
        module, _, attribute = self.value.partition(":")
        try:
            target: object = import_module(module.strip())
            for part in attribute.strip().split(".") if attribute.strip() else ():
                target = getattr(target, part)
        except Exception as exc:
            raise ConfigError(f"search backend {self.name!r} (from {self.distribution}) cannot be loaded from "
                              f"{self.value!r}: {type(exc).__name__}: {exc}. Reinstall or remove that package.") from None
        if not callable(target):
            raise ConfigError(f"search backend {self.name!r} (from {self.distribution}): {self.value!r} is not a "
                              "factory `(arg, settings) -> SearchBackend`.")
        factory: BackendFactory = target  # callable; its signature is the plug-in's to keep
        return factory

    def spec(self) -> str:
        """How the spec is written (the factory's `backend_spec`; the name when it has none or
        cannot be loaded)."""
        try:
            return str(getattr(self.load(), "spec", self.name))
        except ConfigError:
            return self.name

    def description(self) -> str:
        """The first line of the factory's docstring ('' when none or not loadable)."""
        try:
            doc = getattr(self.load(), "__doc__", None) or ""
        except ConfigError:
            return ""
        return doc.strip().splitlines()[0] if doc.strip() else ""


def available_backends() -> dict[str, BackendEntry]:
    """Every registered backend by name: the built-ins first, then the plug-ins by name.

    Read from the installed distributions' metadata on every call (cheap next to a search), so a
    package installed while the process runs is seen.
    """
    found: dict[str, list[tuple[str, str, str]]] = {}
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = point.dist
        owner = _normalize(dist.name) if dist is not None else "(unknown distribution)"
        if owner == _OWN_DISTRIBUTION:
            continue  # the built-ins come from BUILTIN_BACKENDS, the same table
        version = dist.version if dist is not None else ""
        claims = found.setdefault(point.name.lower(), [])
        if all(owner != seen for seen, _, _ in claims):
            claims.append((owner, version, point.value))
    entries: dict[str, BackendEntry] = {}
    for name in BUILTIN_BACKENDS:
        ignored = tuple(sorted(owner for owner, _, _ in found.pop(name, [])))
        entries[name] = _builtin(name, others=ignored)
    for name in sorted(found):
        (owner, version, value), *rest = sorted(found[name])  # by distribution: not by install order
        entries[name] = BackendEntry(name=name, value=value, distribution=owner, version=version,
                                     others=tuple(o for o, _, _ in rest))
    return entries


def _builtin(name: str, *, others: tuple[str, ...] = ()) -> BackendEntry:
    """The entry of built-in backend `name` (`others`: plug-ins of the same name it wins over)."""
    return BackendEntry(name=name, value=BUILTIN_BACKENDS[name], distribution=_OWN_DISTRIBUTION, version=__version__,
                        others=others)


def backend_specs(entries: Mapping[str, BackendEntry] | None = None) -> str:
    """The spec of every usable backend, `ddgs | searxng[:URL] | ...`, for help and error texts."""
    entries = available_backends() if entries is None else entries
    return " | ".join(entry.spec() for entry in entries.values() if not entry.conflict)


def _fits(spec: str, name: str, arg: str) -> bool:
    """Whether an argument (`arg`, '' for none) fits the written spec of backend `name`."""
    if spec.lower() == name:
        return not arg
    if spec.lower().startswith(name + "[:"):
        return True
    if spec.lower().startswith(name + ":"):
        return bool(arg)
    return True  # a spec written another way says nothing about the argument


def make_backend(spec: str, settings: Settings) -> SearchBackend:
    """Build the backend a spec string (`NAME` or `NAME:ARG`) names, built-in or plug-in, with the
    factory registered for that name in the `amapreduce.search_backends` entry-point group; a
    built-in remote one gets the `search_breaker_*` circuit breaker.

    Raises:
        ConfigError: unknown name or a spec its backend does not take (listing the available
            backends), a missing key or URL, a missing corpus index, a plug-in that cannot be
            loaded or returns no `SearchBackend`.
    """
    name, _, arg = spec.strip().partition(":")
    name = name.lower()
    # a built-in wins over any plug-in of its name: no need to read every distribution's metadata
    # (tens of ms, paid by each Ray chunk and evaluation trial that builds its parts)
    entry = _builtin(name) if name in BUILTIN_BACKENDS else available_backends().get(name)
    factory = entry.load() if entry is not None else None
    if entry is None or factory is None or not _fits(str(getattr(factory, "spec", name + "[:ARG]")), name, arg):
        raise ConfigError(f"unknown search backend {spec!r}. Use one of: {backend_specs()}.")
    backend = factory(arg, settings)
    if not isinstance(backend, SearchBackend):
        raise ConfigError(f"search backend {name!r} (from {entry.distribution}) returned {type(backend).__name__}, "
                          "not a SearchBackend.")
    return backend
