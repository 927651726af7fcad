"""The package version, in a module of its own so that any layer can name it (the crawler's
User-Agent, `amapreduce --version`) without importing the package root, which sits at the top."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
