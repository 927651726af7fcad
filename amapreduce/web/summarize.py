"""Optional query-focused extraction of a crawled page through a model.

Why: a long page costs the sub-agent thousands of tokens; the reference asks a model for a
≤ 500-word digest of what matches the query. Here it is optional (off when no model is given or
`focused=False`), and a failed extraction returns the page text with a visible note instead of
losing the page.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from smolagents import Model

__all__ = ["NO_MATCH", "focused_extract"]

log = logging.getLogger(__name__)

NO_MATCH = "No relevant information"
"""What the model replies when nothing on the page matches (and what an empty reply becomes)."""


def focused_extract(model: Model, query: str, url: str, content: str, *, max_words: int = 500) -> str:
    """Ask `model` for the parts of `content` that answer `query`.

    Returns:
        The model's digest; on a model failure, `content` preceded by a one-line note saying
        the extraction failed (the failure is also logged).

    Raises:
        BudgetExceeded, ProviderUnavailable: the run's budget is spent or its provider is down;
            these stop the run and are never hidden behind the page text.
    """
    from amapreduce.errors import BudgetExceeded, ProviderUnavailable
    from amapreduce.llm.complete import complete
    from amapreduce.llm.guard import ModelRequestsBlocked
    from amapreduce.prompts import render_prompt

    prompt = render_prompt("web", "focused_extraction", query=query, url=url, content=content, max_words=max_words,
                           no_match=NO_MATCH)
    try:
        text = complete(model, prompt)
    except (ModelRequestsBlocked, BudgetExceeded, ProviderUnavailable):
        raise  # the run's end (budget spent, provider down), not this page's: the run stops
    except Exception as exc:  # a provider error must not lose the page: fall back to its text
        log.warning("focused extraction of %s failed: %s", url, exc)
        return f"(focused extraction failed: {type(exc).__name__}: {exc}; showing the page text)\n\n{content}"
    return text.strip() or NO_MATCH
