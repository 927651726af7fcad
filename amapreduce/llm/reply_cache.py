"""Model replies kept on disk by (model id, prompt), so the same question is asked once.

Used wherever a reply depends only on the model and the prompt: the evaluation's judges (a
re-score asks nothing again) and discovery's merge calls (a resumed run gets its merges back from
the run directory's `merge-cache/` instead of paying for them twice).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from amapreduce._atomic import write_json
from amapreduce.errors import RunError

__all__ = ["ReplyCache"]


class ReplyCache:
    """Replies cached on disk, one JSON file per sha256(model id, prompt); writes are atomic."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, model_id: str, prompt: str) -> Path:
        digest = hashlib.sha256(f"{model_id}\0{prompt}".encode()).hexdigest()
        return self.directory / digest[:2] / f"{digest}.json"

    def get(self, model_id: str, prompt: str) -> str | None:
        """The cached reply, or None.

        Raises:
            RunError: the file is there but unreadable (delete it to ask again).
        """
        path = self._path(model_id, prompt)
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise RunError(f"reply cache file {path} is unreadable: {exc}. Delete it to re-ask.") from None
        reply = record.get("reply") if isinstance(record, dict) else None
        return reply if isinstance(reply, str) else None

    def put(self, model_id: str, prompt: str, reply: str) -> None:
        """Store a reply (atomically)."""
        path = self._path(model_id, prompt)
        write_json(path, {"model": model_id, "prompt_sha256": path.stem, "reply": reply})
