"""The model seam as composable wrappers: each cross-cutting behaviour of a model call is one model
that wraps another, so each is read, configured and tested alone, and the stack is composed in
one place (`stack.compose`).

Why wrappers rather than one class: a call's budget, breaker, limiter, retries, hedges, meter and
trace used to share one `generate` and one state object, so none could be tested without the
others and each change touched all of them. Here each layer sees only its own configuration (a
`RetryPolicy`, a breaker gate, a limiter gate, a meter, an endpoint's capabilities) and what the
layers of one call must share travels in the call's log (`base.CallLog`).

The order, outside in (`stack.compose`):

1. `hedge.HedgeModel`: installs the hedger on an OpenAI-compatible client; a late request gets a
   hedge only when everything below has room for it (`has_room_for`).
2. `budget.BudgetModel`: a spent budget fails the call before anything is sent or traced.
3. `endpoint.EndpointModel`: an `--api-base` endpoint's capabilities; a batch's calls are sized to
   its rows (`max_tokens`).
4. `masking.MaskedModel`: no registered secret is ever sent.
5. `trace.TracedModel`: one `model_call` event per call (latency, retries, waits, usage, error).
6. `meter.MeterModel`: the call in flight, then its usage priced and charged by role.
7. `retry.RetryModel`: transient errors retried with backoff, `Retry-After` honoured; a
   cancelled attempt sends nothing more.
8. `breaker.BreakerModel`: each HTTP attempt admitted by the provider's circuit breaker.
9. `limiter.LimiterModel`: each HTTP attempt takes a ticket from the provider's rate limiter.
10. `trace.SpanModel`: the attempt is sent: counted in the call's log, and an OpenTelemetry span.

The provider's client (or a simulated model) is innermost. Layers 1 to 7 run once per call;
8 to 10 once per HTTP attempt (the first and every retry).
"""
