"""Prompt templates, kept as YAML files under `prompts/` and rendered with Jinja2.

The files ship inside the wheel (as `amapreduce/prompts/`); in a source checkout they are read
from the repository's top-level `prompts/` folder. Rendering uses `StrictUndefined`, so a
template that names a missing variable fails loudly instead of sending a model a hole.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jinja2
import yaml

from amapreduce.errors import ConfigError

__all__ = ["load_prompts", "prompts_dir", "render_prompt"]

_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False)


def prompts_dir() -> Path:
    """The folder holding the YAML prompt files (wheel layout first, then source checkout)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "prompts", here.parent / "prompts"):
        if candidate.is_dir():
            return candidate
    raise ConfigError(f"prompt folder not found next to {here}; reinstall amapreduce.")


@functools.cache
def load_prompts(name: str) -> dict[str, str]:
    """Load `prompts/<name>.yaml` as a mapping of template name → template text."""
    path = prompts_dir() / f"{name}.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"prompt file {str(path)!r} does not exist.") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ConfigError(f"prompt file {str(path)!r} must map names to template strings.")
    return data


@functools.cache
def _compiled(name: str, key: str) -> jinja2.Template:
    templates = load_prompts(name)
    if key not in templates:
        raise ConfigError(f"prompt {key!r} is not in prompts/{name}.yaml; it has {sorted(templates)}.")
    return _ENV.from_string(templates[key])


def render_prompt(name: str, key: str, **variables: Any) -> str:
    """Render template `key` of `prompts/<name>.yaml` with `variables`."""
    return _compiled(name, key).render(**variables).strip()
