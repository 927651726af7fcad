"""Retries for model calls: classify the error, back off with jitter, honour `Retry-After`.

Errors are classified by exception type, status code and the provider's structured error code,
never by message text, three ways:

* transient, retried (`classify`): 429 → rate limit, 5xx → server, timeouts, connection errors;
* refused for good (`rejected_status`): 401 (wrong key), 403 (no access), 404 (no such model or
  endpoint), 400 and 422 (a request invalid for this model). No retry and no other batch can
  succeed, so the call raises `ProviderRejected` at once and the run stops `failed` with its one
  line (it is one of `mapreduce.result.RUN_STOPPING_ERRORS`). A 400 that is about this request only
  (its context is too long, a content filter) is not a refusal of the run: it fails the call;
* any other error fails the call (`ModelCallError`, kind `permanent`), and the engine may try the
  batch again with another prompt.

After the last retry the caller gets a `ModelCallError` that says what failed and how often —
never a `None` reply (the reference returned None after five failures and every caller then
crashed on `.content`). Every message carries the provider's text with the configured secrets
masked (`trace.redact_secrets`): a provider that refuses a key echoes it, and these messages reach
the trace, `result.json` and the retry prompts sent back to a model.

Each retry is also announced as a typed `ProviderRetry` event, so a progress display can count
provider retries without pretending they are engine progress.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias, TypeVar

from amapreduce._retry import RetryPolicy, Transient, parse_retry_after, retry_loop
from amapreduce.errors import ProviderRejected, ProviderUnavailable, RunError
from amapreduce.events import Event
from amapreduce.trace import redact_secrets

__all__ = [
    "REJECTION_ADVICE",
    "ModelCallError",
    "ProviderRetry",
    "ProviderRetryHandler",
    "RetryPolicy",
    "Transient",
    "call_with_retries",
    "classify",
    "context_overflow",
    "http_status",
    "refused_as_invalid",
    "rejected_status",
    "rejection",
]

T = TypeVar("T")


class ModelCallError(RunError):
    """A model call failed for good (a permanent error, or retries exhausted)."""


@dataclass(frozen=True, kw_only=True)
class ProviderRetry(Event):
    """A model call that failed transiently and is about to be sent again.

    Emitted once on the model stack's stream (`llm.wrappers.trace.CallEvents`): the trace writes it
    as a `model_retry` line (`trace_fields`: the role, model id, the open usage scope's labels and
    the retry's own fields) and the stack's retry handler (`on_retry`) is told of it.
    """

    trace_event: ClassVar[str | None] = "model_retry"

    role: str
    """The role of the model that is retrying (`manager`, `subagent`, ...)."""
    model_id: str
    retry: int
    """Which retry this is: 1 for the first after the original attempt."""
    kind: str
    """Why the attempt may pass next time: `rate_limit`, `server`, `timeout` or `connection`."""
    delay_s: float
    """The backoff before the retry, in seconds."""
    error: str | None
    """The failed attempt's error (capped, credentials redacted)."""
    labels: Mapping[str, Any] = field(default_factory=dict)
    """The open usage scope's labels (the batch and attempt that made the call)."""

    def trace_fields(self) -> dict[str, Any]:
        """The fields of its `model_retry` trace line."""
        return {"role": self.role, "model_id": self.model_id, **self.labels, "retry": self.retry, "kind": self.kind,
                "delay_s": self.delay_s, "error": self.error}


ProviderRetryHandler: TypeAlias = Callable[[ProviderRetry], object]
"""Told of each `ProviderRetry` (e.g. to count retries in a progress display)."""


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or getattr(exc, "headers", None)
    return parse_retry_after(headers) if headers else None


def http_status(exc: BaseException) -> int | None:
    """The HTTP status `exc` carries (on itself or its response), None when the provider never answered."""
    for owner in (exc, getattr(exc, "response", None)):
        code = getattr(owner, "status_code", None)
        if isinstance(code, int):
            return code
    return None


def _named(exc: BaseException, *names: str) -> bool:
    return any(cls.__name__ in names for cls in type(exc).__mro__)


_VALIDATION = re.compile(
    r"validation errors?\b|Input should be|Field required|'loc': \(|\"loc\": \[|AssertionError|is not supported|"
    r"unsupported (?:value|parameter)|Unrecognized request argument",
    re.IGNORECASE,
)
"""How a server that answers a request it cannot take with an HTTP 500 words it: llama-cpp-python's
server returns pydantic's validation errors (`10 validation errors: {'type': 'string_type', 'loc':
('body', 'messages', ...), 'msg': 'Input should be a valid string'`) and its failed assertions (a
`tool_choice` its chat format refuses) as 500s. Read from the text because the status says
nothing else; what it matches is the form of the request, which no retry changes."""


def refused_as_invalid(exc: BaseException) -> bool:
    """Whether `exc` is an HTTP 500 whose body says the request itself was invalid (`_VALIDATION`):
    a refusal, not an outage, however the status reads."""
    return http_status(exc) == 500 and bool(_VALIDATION.search(_provider_text(exc, limit=2000)))


def classify(exc: BaseException) -> Transient | None:
    """Whether `exc` is worth retrying (and how long the server wants us to wait)."""
    if refused_as_invalid(exc):
        return None
    status = http_status(exc)
    if status == 429 or _named(exc, "RateLimitError"):
        return Transient(kind="rate_limit", retry_after_s=_retry_after(exc))
    if (status is not None and status >= 500) or _named(exc, "InternalServerError", "ServiceUnavailableError"):
        return Transient(kind="server", retry_after_s=_retry_after(exc))
    if _named(exc, "APITimeoutError", "Timeout", "TimeoutException", "ReadTimeout", "ConnectTimeout") or isinstance(
        exc, TimeoutError
    ):
        return Transient(kind="timeout")
    if _named(exc, "APIConnectionError", "ConnectError", "ConnectionError") or isinstance(exc, ConnectionError):
        return Transient(kind="connection")
    return None


_INVALID = "The provider refused the request as invalid for this model: check --model, --api-base and the model's settings."
REJECTION_ADVICE: dict[int, str] = {
    400: _INVALID,
    401: "The API key is wrong or missing: set AMAPREDUCE_API_KEY (or the provider's own variable, e.g. "
    "OPENAI_API_KEY) to a valid key.",
    403: "The key has no access to this model: check the account's permissions, or choose another --model.",
    404: "No such model or endpoint: check --model (and --api-base).",
    422: _INVALID,
    500: "The server answered HTTP 500 with a validation error: it takes requests in another dialect than the one "
    "sent (amapreduce asks an --api-base endpoint what it accepts before a run and keeps the answer in its cache "
    "folder). Set what differs: --message-content string, --tool-choice auto (or off), --structured-output "
    "json_object_schema (or none); see docs/guides/local-models.md.",
}
"""The statuses that refuse a run for good, and what the user should check for each."""

_REJECTION_TYPES = {
    "AuthenticationError": 401,
    "PermissionDeniedError": 403,
    "NotFoundError": 404,
    "BadRequestError": 400,
    "UnprocessableEntityError": 422,
}
"""The openai and LiteLLM exception types of those statuses, for errors that carry no status code."""

_THIS_REQUEST_ONLY = ("ContextWindowExceededError", "ContentPolicyViolationError")
"""LiteLLM's 400s that are about one request's content, not the run's configuration."""
_THIS_REQUEST_CODES = frozenset({"context_length_exceeded", "content_filter", "content_policy_violation",
                                 "string_above_max_length"})
"""The same, as OpenAI's structured error `code`."""


def rejected_status(exc: BaseException) -> int | None:
    """The status of a request the provider refused for good (a key in `REJECTION_ADVICE`), else None.

    A 400 about this request's own content (too long for the context, a content filter) is not
    one: another batch's prompt may pass.
    """
    code = getattr(exc, "code", None)
    if _named(exc, *_THIS_REQUEST_ONLY) or (isinstance(code, str) and code in _THIS_REQUEST_CODES):
        return None
    if refused_as_invalid(exc):
        return 500
    status = http_status(exc)
    if status is not None:
        return status if status in REJECTION_ADVICE and status < 500 else None  # a 500 only as `refused_as_invalid`
    return next((named for name, named in _REJECTION_TYPES.items() if _named(exc, name)), None)


def context_overflow(exc: BaseException) -> bool:
    """Whether `exc` says the request's prompt and reply do not fit the model's context window
    (OpenAI's and llama-cpp-python's `context_length_exceeded`, LiteLLM's `ContextWindowExceededError`):
    the same request with a shorter prompt may pass (`ModelCallError.kind` `context_overflow`)."""
    code = getattr(exc, "code", None)
    return _named(exc, "ContextWindowExceededError") or code == "context_length_exceeded"


def _provider_text(exc: BaseException, *, limit: int = 400) -> str:
    """The provider's own message of `exc` on one line, capped, secrets masked (the OpenAI SDK
    keeps it in `body["message"]`; its `str()` is a dict's repr)."""
    body = getattr(exc, "body", None)
    message = body.get("message") if isinstance(body, Mapping) else None
    text = " ".join((message if isinstance(message, str) and message else str(exc)).split())
    text = redact_secrets(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def rejection(exc: BaseException, *, what: str, provider: str) -> ProviderRejected | None:
    """The `ProviderRejected` that `exc` amounts to (see `rejected_status`), or None."""
    status = rejected_status(exc)
    if status is None:
        return None
    detail = _provider_text(exc)
    return ProviderRejected(
        f"{what} was refused by the provider: HTTP {status} {type(exc).__name__}: {detail.rstrip('.')}. "
        f"{REJECTION_ADVICE[status]}",
        provider=provider, status=status, failures=1, last_error=f"{type(exc).__name__}: {detail}",
    )


def call_with_retries(
    call: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy,
    provider: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    on_retry: Callable[[int, Transient, float], Any] | None = None,
) -> T:
    """Run a model call, retrying transient errors per `policy`.

    `what` names the call in messages (`subagent model 'gpt-5-mini'`); `provider` is the
    provider's key in a `ProviderRejected` (default: `what`).

    Raises:
        ProviderRejected: the provider refused the request for good (`rejected_status`), or `call` raised
            a `ProviderUnavailable` itself (re-raised as it is); not retried.
        ModelCallError: another permanent error (immediately) or the last transient one.
        The original exception is chained as `__cause__`; messages never hold a registered secret.
    """

    def give_up(exc: Exception, attempts: int, transient: Transient | None) -> RunError:
        if isinstance(exc, ProviderUnavailable):  # the call's own verdict (`llm.breaker.unreachable`): as raised
            return exc
        if transient is None:
            refused = rejection(exc, what=what, provider=provider or what)
            if refused is not None:
                return refused
            return ModelCallError(f"{what} failed: {type(exc).__name__}: {redact_secrets(str(exc))}",
                                  kind="context_overflow" if context_overflow(exc) else "permanent")
        return ModelCallError(
            f"{what} failed after {attempts} attempts ({transient.kind}): {type(exc).__name__}: {redact_secrets(str(exc))}. "
            "Check the provider's status and your rate limits, or lower --workers.",
            kind=transient.kind,
        )

    return retry_loop(call, policy=policy, classify=classify, give_up=give_up, sleep=sleep, rng=rng, on_retry=on_retry)
