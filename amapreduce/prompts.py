"""The one prompt renderer: templates kept as YAML files under `prompts/`, rendered with Jinja2.

Every prompt the package sends goes through `render_prompt`: the manager's and sub-agents'
instructions, the batch and continuation prompts, the memory model's prompts, the judges'
official prompts and the page-extraction prompt. The files ship inside the wheel (as
`amapreduce/prompts/`); in a source checkout they are read from the repository's top-level
`prompts/` folder. Rendering uses `StrictUndefined`, so a template that names a missing variable
fails loudly instead of sending a model a hole; loaded templates are read-only, so no caller can
change what the next one renders.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jinja2
import yaml

from amapreduce.errors import ConfigError

__all__ = ["prompt_names", "prompts_dir", "render_prompt"]

# Templates render exactly as written (a trailing newline included): the official judge prompts are
# sent byte for byte.
_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)


def prompts_dir() -> Path:
    """The folder holding the YAML prompt files (wheel layout first, then source checkout)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "prompts", here.parent / "prompts"):
        if candidate.is_dir():
            return candidate
    raise ConfigError(f"prompt folder not found next to {here}; reinstall amapreduce.")


@functools.cache
def _templates(name: str) -> Mapping[str, str]:
    """`prompts/<name>.yaml` as a read-only mapping of template name → template text."""
    path = prompts_dir() / f"{name}.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"prompt file {str(path)!r} does not exist.") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ConfigError(f"prompt file {str(path)!r} must map names to template strings.")
    return MappingProxyType(data)


def prompt_names(name: str) -> tuple[str, ...]:
    """The template names `prompts/<name>.yaml` defines."""
    return tuple(_templates(name))


_COMPILING = threading.Lock()
"""Held while a template is read and compiled: the first wave of a wide run's sub-agents asks for
the same templates at once, and each would otherwise parse the YAML and compile them itself."""


def _compiled(name: str, key: str) -> jinja2.Template:
    with _COMPILING:
        return _compile(name, key)


@functools.cache
def _compile(name: str, key: str) -> jinja2.Template:
    templates = _templates(name)
    if key not in templates:
        raise ConfigError(f"prompt {key!r} is not in prompts/{name}.yaml; it has {sorted(templates)}.")
    return _ENV.from_string(templates[key])


def render_prompt(name: str, key: str, **variables: Any) -> str:
    """Render template `key` of `prompts/<name>.yaml` with `variables`, exactly as written.

    Raises:
        ConfigError: the file or the template does not exist.
        jinja2.UndefinedError: the template uses a variable that was not given.
    """
    return _compiled(name, key).render(**variables)
