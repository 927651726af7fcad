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

__all__ = ["EXTRACTION_PROMPT", "NO_MATCH", "focused_extract"]

log = logging.getLogger(__name__)

NO_MATCH = "No relevant information"
EXTRACTION_PROMPT = """Extract all content matching the search query from the web page below.

Search query: {query}
Page URL: {url}

Instructions:
- Summarise every relevant passage, table row and list item as concise points; keep names, numbers and dates exactly as written.
- If nothing on the page matches the query, reply exactly: {no_match}
- Stay under {max_words} words.

Page content:
{content}
"""


def focused_extract(model: Model, query: str, url: str, content: str, *, max_words: int = 500) -> str:
    """Ask `model` for the parts of `content` that answer `query`.

    Returns:
        The model's digest; on a model failure, `content` preceded by a one-line note saying
        the extraction failed (the failure is also logged).
    """
    from smolagents.models import ChatMessage, MessageRole

    from amapreduce.errors import RunCancelled
    from amapreduce.llm.guard import ModelRequestsBlocked

    prompt = EXTRACTION_PROMPT.format(query=query, url=url, content=content, max_words=max_words, no_match=NO_MATCH)
    message = ChatMessage(role=MessageRole.USER, content=[{"type": "text", "text": prompt}])
    try:
        reply = model.generate([message])
    except (ModelRequestsBlocked, RunCancelled):
        raise
    except Exception as exc:  # a provider error must not lose the page: fall back to its text
        log.warning("focused extraction of %s failed: %s", url, exc)
        return f"(focused extraction failed: {type(exc).__name__}: {exc}; showing the page text)\n\n{content}"
    text = reply.content if isinstance(reply.content, str) else str(reply.content or "")
    return text.strip() or NO_MATCH
