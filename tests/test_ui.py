"""`amapreduce ui`: every page through Starlette's TestClient, over a real demo run and real
`eval run` folders (simulated model, offline), and every refusal: path traversal, a missing or
wrong token, a foreign Host, a missing or wrong CSRF token, and HTML in the data."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from records import cell, role_usage, write_record
from starlette.exceptions import HTTPException
from starlette.testclient import TestClient
from test_memory_fixtures import QUERY, ranked_store

from amapreduce.cli.app import main
from amapreduce.errors import ConfigError, UserError
from amapreduce.memory import MemoryStore
from amapreduce.memory.inspection import show_item
from amapreduce.memory.store import insert_hint
from amapreduce.session.journal import RunKind, RunStarted, open_run_journal
from amapreduce.settings import Settings
from amapreduce.table.evidence import Evidence
from amapreduce.ui import UIConfig, bind, create_app
from amapreduce.ui.security import contained
from amapreduce.ui.timeline import LABEL_WIDTH, PLOT_WIDTH, read_timeline

LOCAL = "http://127.0.0.1"
CSRF = "csrf-token-for-the-tests-0123456789"
SCRIPT = "<script>alert(1)</script>"
CRAFTED = "20990101-000000-crafted"


def _crafted_run(runs: Path) -> None:
    """A run whose table holds HTML, a conflict, a missing cell and two kinds of source."""
    folder = runs / CRAFTED
    cells = {"Name": cell(SCRIPT, "found", "javascript:alert(2)"),
             "Capital": cell("A", "conflict", "https://example.org/a?x=1&y=2", alternatives=["B<i>"]),
             "Population": cell("", "missing")}
    write_record(folder, query="<b>which</b> countries?", status="incomplete",
                 completeness={"rows": 1, "missing_cells": 1, "complete": False},
                 table={"columns": ["Name", "Capital", "Population"], "key_columns": ["Name"],
                        "rows": [{"task_index": 0, "cells": cells, "origin": "top[2019]"}]},
                 usage={"by_role": {"manager": role_usage(2, 10, 5, 0.5)}, "total": role_usage(2, 10, 5, 0.5)},
                 timings={"wall_s": 12.5})
    (folder / "table.csv").write_text(f'Name,Capital,Population\n"{SCRIPT}",A,\n', encoding="utf-8")


def run_offline(root: Path, *commands: list[str]) -> None:
    """Run `amapreduce` commands in `root` as a fresh user would, with no AMAPREDUCE_*/OPENAI_*
    setting (a module fixture runs before the per-test fixture that clears them)."""
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith(("AMAPREDUCE_", "OPENAI_")):
                mp.delenv(name)
        mp.chdir(root)
        for argv in commands:
            assert main(argv) == 0, argv


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a demo run with faults (retries, a patch round), a crafted run, and two
    `eval run` folders of the sandbox (memory on, and --no-memory)."""
    root = tmp_path_factory.mktemp("ui")
    base = ["eval", "run", "--benchmark", "sandbox", "--limit", "2", "--encoder", "hashing", "--json"]
    run_offline(root, ["demo", "--faults", "0.3", "--seed", "3", "--no-memory", "--json"],
                [*base, "--out", str(root / "ev-on")], [*base, "--no-memory", "--out", str(root / "ev-off")])
    _crafted_run(root / "runs")
    return root


def _config(root: Path, **extra: object) -> UIConfig:
    values: dict[str, object] = {"runs_dir": root / "runs", "memory": root / "store", "plot_dir": root / "plots",
                                 "evals": (root / "ev-on", root / "ev-off"), **extra}
    return UIConfig.model_validate(values)


@pytest.fixture()
def client(world: Path, tmp_path: Path) -> TestClient:
    ranked_store(tmp_path / "store")[0].close()
    with MemoryStore(tmp_path / "store") as store, store.write() as conn:
        insert_hint(conn, f"hint with {SCRIPT}", 0, origin="test", provenance=["P1"], hint_id="hX")
    config = _config(world, memory=tmp_path / "store", plot_dir=tmp_path / "plots")
    return TestClient(create_app(config, csrf_token=CSRF), base_url=LOCAL)


def _demo_run(world: Path) -> str:
    return next(p.name for p in (world / "runs").iterdir() if p.name != CRAFTED)


# --- runs ---------------------------------------------------------------------------------------


def test_runs_page_lists_runs_with_status_rows_missing_cells_cost_and_wall_time(client: TestClient, world: Path) -> None:
    page = client.get("/runs")
    assert page.status_code == 200
    rows = re.findall(r"<tr>\s*<td><a href=\"/runs/([^\"]+)\">.*?</tr>", page.text, re.DOTALL)
    assert rows == [CRAFTED, _demo_run(world)]  # newest first
    crafted = page.text.split(f'href="/runs/{CRAFTED}"')[1].split("</tr>")[0]
    assert "state-incomplete" in crafted and "$0.5000" in crafted and "12.5 s" in crafted
    assert re.search(r'<td class="n">1</td>\s*<td class="n">1</td>', crafted)  # rows, missing cells
    assert "&lt;b&gt;which&lt;/b&gt;" in crafted and "<b>which" not in page.text
    assert "http-equiv=\"refresh\"" not in page.text  # nothing is running


def test_runs_page_reads_each_run_once(world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wall time comes with `list_runs`' rows: the page does not read each `result.json` again."""
    from amapreduce.session import rundir
    from amapreduce.ui.runs import runs_view

    real, read = rundir.read_run, []

    def counting(runs_dir: Path, run: str) -> rundir.StoredRun:
        read.append(run)
        return real(runs_dir, run)

    monkeypatch.setattr(rundir, "read_run", counting)
    monkeypatch.setattr("amapreduce.ui.runs.read_run", counting)  # the page's own reads count too
    view = runs_view(world / "runs", None)
    assert len(read) == len(view["runs"]) == 2
    assert {r["run"]: r["wall_s"] for r in view["runs"]}[CRAFTED] == 12.5


def test_runs_filter_by_status(client: TestClient, world: Path) -> None:
    complete = client.get("/runs", params={"status": "complete"}).text
    assert _demo_run(world) in complete and CRAFTED not in complete
    assert "No runs with status failed here." in client.get("/runs", params={"status": "failed"}).text
    bad = client.get("/runs", params={"status": "purple"})
    assert bad.status_code == 400 and "unknown status &#39;purple&#39;" in bad.text


def test_a_running_run_is_shown_live_and_its_pages_refresh(world: Path, tmp_path: Path) -> None:
    live = tmp_path / "runs" / "20990102-000000-live"
    with open_run_journal(live) as journal:  # started by this process, which lives: the run is going
        journal.append(RunStarted.now(command=RunKind.ASK, query="still <going>", settings=Settings()))
    client = TestClient(create_app(_config(world, runs_dir=tmp_path / "runs")), base_url=LOCAL)
    listing = client.get("/runs", params={"status": "running"}).text
    assert '<meta http-equiv="refresh" content="3">' in listing
    assert "state-running" in listing and "0/0 batches" in listing and "still &lt;going&gt;" in listing
    page = client.get(f"/runs/{live.name}").text
    assert '<meta http-equiv="refresh" content="3">' in page and "No table recorded yet." in page
    assert 'http-equiv="refresh"' not in TestClient(create_app(_config(world)), base_url=LOCAL).get(f"/runs/{CRAFTED}").text


def test_run_page_shows_table_timeline_decision_plan_and_usage(client: TestClient, world: Path) -> None:
    name = _demo_run(world)
    page = client.get(f"/runs/{name}")
    assert page.status_code == 200
    result = json.loads((world / "runs" / name / "result.json").read_text())
    table = page.text.split('id="result-table"')[1].split("</table>")[0]
    cells = re.findall(r'<td class="(cell-[a-z]+)( cell-verified)?" title="([^"]*)" data-status="(\w+)">([^<]*)', table)
    cells = [(c[0], c[2], c[3], c[4]) for c in cells if not c[1] or "quote: " in c[2]]  # verified cells show their quote
    assert len(cells) == 14 * 5 and {c[0] for c in cells} == {"cell-found"}
    assert table.count("cell-verified") == 14 * 4  # every cell a sub-agent answered: the Country cells are the matrix's
    assert [c[3].strip() for c in cells[:5]] == [result["table"]["rows"][0]["cells"][c]["value"] for c in
                                                   result["table"]["columns"]]
    assert "source: corpus://sandbox/countries/ar.html" in cells[1][1]
    assert "found: 70" in page.text
    assert "quote verified: 56" in page.text and "quote unverified: 0" in page.text  # the legend of the left marker
    gantt = page.text.split('id="timeline"')[1].split("</svg>")[0]
    completeness = result["completeness"]
    assert gantt.count('class="bar bar-') == completeness["attempts"]
    assert gantt.count("bar-error") + gantt.count("bar-parse_error") == completeness["failures"] > 0
    assert gantt.count("mark-patch") == completeness["patch_rounds"] >= 1
    assert "patch1.1-batch-001" in gantt and "mark-retry" in gantt
    assert "per_atom" in page.text and "one row per sub-agent" in page.text
    assert "Batch plan: 14 batches" in page.text  # the map's plan (one country per sub-agent); patch batches come later
    usage = page.text.split('id="usage"')[1].split("</table>")[0]
    assert all(role in usage for role in ("manager", "subagent", "total")) and "$0.0000" in usage
    total = result["usage"]["total"]
    assert (f'<td>total</td><td class="n">{total["requests"]}</td><td class="n">{total["prompt_tokens"]}</td>'
            f'<td class="n">{total["completion_tokens"]}</td>') in usage
    assert f'href="/runs/{name}/download/csv"' in page.text and f'href="/runs/{name}/download/jsonl"' in page.text


def test_html_in_a_run_is_shown_as_text_and_only_http_sources_are_links(client: TestClient) -> None:
    page = client.get(f"/runs/{CRAFTED}").text
    assert SCRIPT not in page and "<i>" not in page and "<b>which" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'class="cell-conflict" title="status: conflict, confidence 0.3\nsource: https://example.org/a?x=1&amp;y=2\nalso seen: B&lt;i&gt;"' in page
    assert 'class="cell-missing"' in page
    assert 'href="https://example.org/a?x=1&amp;y=2"' in page and "javascript:" not in page.split("<tbody>")[1].split('href="')[1]
    assert 'href="javascript' not in page
    usage = page.split('id="usage"')[1].split("</table>")[0]  # the older spelling, input/output_tokens, reads too
    assert '<td>manager</td><td class="n">2</td><td class="n">10</td><td class="n">5</td>' in usage


def test_downloads(client: TestClient, world: Path) -> None:
    name = _demo_run(world)
    csv = client.get(f"/runs/{name}/download/csv")
    assert csv.status_code == 200 and csv.text == (world / "runs" / name / "table.csv").read_text()
    assert csv.headers["content-disposition"] == f'attachment; filename="{name}-table.csv"'
    assert client.get(f"/runs/{name}/download/md").text.startswith("```markdown\n| Country |")
    lines = [json.loads(x) for x in client.get(f"/runs/{CRAFTED}/download/jsonl").text.splitlines()]
    assert lines == [{"Name": SCRIPT, "Capital": "A", "Population": "", "_missing": ["Population"],
                      "_conflicts": {"Capital": ["B<i>"]}, "_sources": ["https://example.org/a?x=1&y=2",
                                                                        "javascript:alert(2)"],
                      "_quotes": {}, "_evidence": {"Name": "no_evidence", "Capital": "no_evidence"},
                      "_confidence": {"Name": 0.6, "Capital": 0.3},  # no quote 0.6; halved by the conflict
                      "_origin": "top[2019]"}]  # a nested run's provenance (`Row.origin`) comes back too
    assert client.get(f"/runs/{CRAFTED}/download/md").status_code == 400  # it has no table.md
    assert client.get(f"/runs/{name}/download/exe").status_code == 400


@pytest.mark.parametrize("url", [
    "/runs/%2e%2e", "/runs/..%2F..%2Fetc", "/runs/%2Fetc", "/runs/nope",
    "/runs/..%2Fev-on/download/csv", "/evals/0/run/%2e%2e/%2e%2e/etc",
    "/evals/0/run//etc", "/evals/0/run/runs/..%2F..%2F..", "/evals/0/run/%2Fetc%2Fpasswd",
    "/evals/0/download/csv/..%2F..%2Fruns%2F" + CRAFTED, "/evals/7", "/evals/7/run/runs",
])
def test_paths_never_leave_the_served_folders(client: TestClient, url: str) -> None:
    response = client.get(url)
    assert response.status_code == 404, response.text
    assert "root:" not in response.text and "Name,Capital" not in response.text


@pytest.mark.parametrize("relative", ["..", "../x", "a/../..", "/etc", "runs//x", "./runs", "runs\\..", "a\x00b", ""])
def test_contained_refuses_every_way_out(world: Path, relative: str) -> None:
    with pytest.raises(HTTPException) as refused:
        contained(world / "ev-on", relative)
    assert refused.value.status_code == 404
    assert contained(world / "ev-on", "runs/sbx_en_001") == (world / "ev-on" / "runs" / "sbx_en_001").resolve()


def test_a_symlink_out_of_the_runs_folder_is_refused(world: Path, client: TestClient, tmp_path: Path) -> None:
    outside = tmp_path / "outside-run"
    _crafted_run(outside)
    link = world / "runs" / "link-out"
    link.symlink_to(outside / CRAFTED)
    try:
        assert client.get("/runs/link-out").status_code == 404
        assert client.get("/runs/link-out/download/csv").status_code == 404
    finally:
        link.unlink()


def test_the_download_routes_refuse_a_symlinked_file(world: Path, client: TestClient, tmp_path: Path) -> None:
    """A run folder inside `runs/` whose `table.csv`, `table.md` or `result.json` is a link to a file
    outside is not served (issue 29): 404, as for a missing file, and nothing of the target shows."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the contents of a private file\n", encoding="utf-8")
    folder = world / "runs" / "20990101-000001-linked-files"
    _crafted_run(folder.parent / "linked-tmp")
    (folder.parent / "linked-tmp" / CRAFTED).rename(folder)
    (folder.parent / "linked-tmp").rmdir()
    try:
        assert client.get(f"/runs/{folder.name}/download/csv").status_code == 200  # its own file is served
        (folder / "table.csv").unlink()
        (folder / "table.csv").symlink_to(secret)
        (folder / "table.md").symlink_to(secret)
        for fmt in ("csv", "md"):
            reply = client.get(f"/runs/{folder.name}/download/{fmt}")
            assert reply.status_code == 404 and "private file" not in reply.text
        assert "download/csv" not in client.get(f"/runs/{folder.name}").text  # nor offered
        (folder / "result.json").rename(tmp_path / "result.json")
        (folder / "result.json").symlink_to(tmp_path / "result.json")
        assert client.get(f"/runs/{folder.name}/download/jsonl").status_code == 404
    finally:
        for name in ("table.csv", "table.md", "result.json"):
            (folder / name).unlink(missing_ok=True)
        folder.rmdir()


def test_every_response_forbids_scripts_and_framing(client: TestClient) -> None:
    for url in ("/runs", "/runs/nope", "/memory"):
        headers = client.get(url).headers
        assert "script-src" not in headers["content-security-policy"]
        assert headers["content-security-policy"].startswith("default-src 'none'")
        assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"


# --- who may ask --------------------------------------------------------------------------------


def test_a_loopback_server_answers_only_loopback_host_names(client: TestClient) -> None:
    assert client.get("/runs", headers={"host": "localhost:8765"}).status_code == 200
    assert client.get("/runs", headers={"host": "[::1]:8765"}).status_code == 200
    refused = client.get("/runs", headers={"host": "attacker.example:8765"})
    assert refused.status_code == 400 and "loopback" in refused.text


def test_other_hosts_need_a_long_token(world: Path) -> None:
    with pytest.raises(ConfigError, match="--token"):
        create_app(_config(world, host="0.0.0.0"))
    with pytest.raises(ConfigError, match="at least 16"):
        create_app(_config(world, host="0.0.0.0", token="short"))
    with pytest.raises(UserError, match="is not a folder"):
        create_app(_config(world, evals=(world / "nope",)))


def test_with_a_token_every_request_carries_it(world: Path) -> None:
    token = "a-long-random-token-0123456789"
    app = create_app(_config(world, host="0.0.0.0", token=token), csrf_token=CSRF)
    anyone = TestClient(app, base_url="http://192.0.2.10:8765")
    for url in ("/runs", f"/runs/{CRAFTED}", "/memory", "/evals/0", "/static/style.css"):
        assert anyone.get(url).status_code == 401
    assert anyone.get("/runs", params={"token": token + "x"}).status_code == 401
    assert anyone.get("/runs", headers={"authorization": "Bearer nope"}).status_code == 401
    assert anyone.get("/runs", headers={"cookie": "amapreduce_ui_token=nope"}).status_code == 401
    assert anyone.post("/memory/prune", data={"csrf": CSRF, "threshold": "9", "confirm": "yes"}).status_code == 401
    assert anyone.get("/runs", headers={"authorization": f"Bearer {token}"}).status_code == 200
    first = anyone.get("/runs", params={"token": token, "status": "complete"}, follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == "/runs?status=complete"
    assert "HttpOnly" in first.headers["set-cookie"] and "SameSite=Strict" in first.headers["set-cookie"]
    assert anyone.get("/runs").status_code == 200  # the cookie set above now carries it
    fresh = TestClient(app, base_url="http://192.0.2.10:8765")  # the redirect never leads to another host
    odd = fresh.get("http://192.0.2.10:8765//evil.example/x", params={"token": token}, follow_redirects=False)
    assert odd.status_code == 303 and odd.headers["location"] == "/evil.example/x"


def test_cli_refuses_an_unsafe_or_impossible_server_before_listening(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ui", "--host", "0.0.0.0", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --host 0.0.0.0 listens beyond this machine: give --token") and "serving" not in err
    assert main(["ui", "--host", "0.0.0.0", "--token", "short", "--runs-dir", str(tmp_path)]) == 2
    assert "at least 16 characters" in capsys.readouterr().err
    assert main(["ui", "--eval", str(tmp_path / "nope")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    taken = bind("127.0.0.1", 0)
    try:
        with pytest.raises(UserError, match="Choose another --port"):
            bind("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()


def test_the_command_serves_until_ctrl_c(world: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMAPREDUCE_", "OPENAI_"))}
    server = subprocess.Popen(
        [sys.executable, "-c", "from amapreduce.cli.app import run; run()", "ui", "--port", "0",
         "--runs-dir", str(world / "runs"), "--eval", str(world / "ev-on")],
        cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline() if server.stderr else ""
        found = re.match(r"amapreduce ui: serving (http://127\.0\.0\.1:\d+/); Ctrl-C stops\.$", line.strip())
        assert found, line
        with httpx.Client(trust_env=False) as http:
            assert CRAFTED in http.get(found.group(1) + "runs").text
            assert http.get(found.group(1) + "evals/0").status_code == 200
    finally:
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=60)
    assert server.returncode == 130  # interrupted, as every command stopped by Ctrl-C


# --- memory -------------------------------------------------------------------------------------


def test_memory_page_lists_hints_records_and_statistics(client: TestClient) -> None:
    page = client.get("/memory").text
    hints = re.findall(r'href="/memory/items/(h\w+)"', page.split('id="hints"')[1].split("</table>")[0])
    assert hints == ["hD", "hB", "hE", "hC", "hA", "hX"]  # best score first, as `memory list --hints`
    assert "hint with &lt;script&gt;" in page and SCRIPT not in page
    assert len(re.findall(r'href="/memory/items/([PN]\d)"', page)) == 8
    assert client.get("/memory", params={"contains": "hB"}).text.count('href="/memory/items/h') == 1


def test_memory_search_shows_what_the_plan_stage_would_retrieve(client: TestClient) -> None:
    page = client.get("/memory/search", params={"q": QUERY}).text
    positives = page.split('id="positives"')[1].split("</table>")[0]
    assert re.findall(r"/memory/items/(\w+)", positives) == ["P1", "P2", "P3", "P4"]
    ranked = page.split('id="ranked-hints"')[1].split("</table>")[0]
    assert re.findall(r"/memory/items/(\w+)", ranked) == ["hB", "hE", "hA"]  # by s = w + v, as `memory search`
    assert "- hint hB." in page.split('id="prior"')[1]
    assert client.get("/memory/search").status_code == 400


def test_memory_item_shows_provenance_and_change_log(client: TestClient) -> None:
    page = client.get("/memory/items/hE").text
    assert re.findall(r"<li><a href=\"/memory/items/(\w+)\"", page) == ["P1", "N1"]
    assert "hint_added" in page and 'name="csrf" value="' + CSRF in page
    record = client.get("/memory/items/P1").text
    assert "question P1" in record and "hA" in record
    assert client.get("/memory/items/zzz").status_code == 400


def test_memory_edits_need_the_csrf_token(client: TestClient, tmp_path: Path) -> None:
    for url in ("/memory/hints/hE/edit", "/memory/hints/hE/remove", "/memory/prune"):
        form = {"text": "x", "score": "1", "threshold": "9", "confirm": "yes"}
        assert client.post(url, data=form).status_code == 403
        assert client.post(url, data={**form, "csrf": CSRF + "x"}).status_code == 403
        assert client.get(url).status_code == 405
        assert client.post(url, content=json.dumps({**form, "csrf": CSRF}),
                           headers={"content-type": "application/json"}).status_code == 415
    assert client.post("/memory/prune", data={"csrf": CSRF, "text": "x" * 70000}).status_code == 413
    with MemoryStore(tmp_path / "store") as store:
        assert show_item(store, "hE")["w"] == 3 and len(show_item(store, "hE")["events"]) == 1


def test_edit_remove_and_prune_apply_only_after_confirmation(client: TestClient, tmp_path: Path) -> None:
    preview = client.post("/memory/hints/hE/edit", data={"csrf": CSRF, "text": "  better   hint ", "score": "5"})
    assert preview.status_code == 200 and 'name="confirm" value="yes"' in preview.text
    assert "better hint" in preview.text.split('id="change"')[1]
    with MemoryStore(tmp_path / "store") as store:
        assert show_item(store, "hE")["text"] == "hint hE."  # nothing changed yet
    done = client.post("/memory/hints/hE/edit", data={"csrf": CSRF, "text": "better hint", "score": "5",
                                                      "confirm": "yes"}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/memory/items/hE?done=edited"
    with MemoryStore(tmp_path / "store") as store:
        hint = show_item(store, "hE")
    assert (hint["text"], hint["w"]) == ("better hint", 5)
    assert hint["events"][-1] | {"at": None} == {"at": None, "kind": "hint_edited_by_hand", "w_before": 3, "w_after": 5,
                                                 "text_before": "hint hE.", "text_after": "better hint", "via": "ui"}
    assert client.post("/memory/hints/hE/edit", data={"csrf": CSRF, "text": "better hint", "score": "5"}).status_code == 400
    assert client.post("/memory/hints/hE/edit", data={"csrf": CSRF, "text": "x", "score": "many"}).status_code == 400

    assert "Remove hint hB?" in client.post("/memory/hints/hB/remove", data={"csrf": CSRF}).text
    assert client.post("/memory/hints/P1/remove", data={"csrf": CSRF}).status_code == 400  # a record
    client.post("/memory/hints/hB/remove", data={"csrf": CSRF, "confirm": "yes"})
    preview = client.post("/memory/prune", data={"csrf": CSRF, "threshold": "2"}).text
    assert re.findall(r"<tr><td>(h\w)</td>", preview.split('id="doomed"')[1]) == ["hA", "hC", "hX"]
    client.post("/memory/prune", data={"csrf": CSRF, "threshold": "2", "confirm": "yes"})
    with MemoryStore(tmp_path / "store") as store, store.read() as conn:
        left = [r[0] for r in conn.execute("SELECT id FROM hints ORDER BY id")]
        kinds = [r[0] for r in conn.execute("SELECT kind FROM events WHERE kind LIKE 'hint_%' ORDER BY seq")][-4:]
    assert left == ["hD", "hE"] and kinds == ["hint_removed_by_hand", "hint_pruned", "hint_pruned", "hint_pruned"]


def test_a_missing_store_is_a_page_that_says_so(world: Path, tmp_path: Path) -> None:
    client = TestClient(create_app(_config(world, memory=tmp_path / "none")), base_url=LOCAL)
    page = client.get("/memory")
    assert page.status_code == 404 and "no memory store at" in page.text
    assert not (tmp_path / "none").exists()  # looking creates nothing


# --- evaluation ---------------------------------------------------------------------------------


def test_evaluations_list(client: TestClient) -> None:
    page = client.get("/evals").text
    rows = page.split('id="evals"')[1]
    assert "memory on" in rows and "memory off" in rows and rows.count("sandbox") == 2


def test_evaluation_page_shows_summary_per_task_plots_and_memory_on_vs_off(client: TestClient, world: Path) -> None:
    page = client.get("/evals/0")
    assert page.status_code == 200
    results = json.loads((world / "ev-on" / "results.json").read_text())
    summary = page.text.split('id="summary"')[1].split("</table>")[0]
    assert f"{results['summary']['f1_by_item']['avg_n']:.4f}" in summary
    per_task = page.text.split('id="per-task"')[1].split("</table>")[0]
    assert re.findall(r"<tr><td>(sbx_en_\d+)</td>", per_task) == results["task_order"]
    link = re.findall(r'href="(/evals/0/run/[^"]+)"', per_task)[0]
    assert link == "/evals/0/run/" + results["per_task"]["sbx_en_001"][0]["run_dir"]
    assert "found: " in client.get(link).text  # an evaluation's run opens as a Run page
    compare = page.text.split('id="compare"')[1].split("</table>")[0]
    assert "memory on" in compare and "memory off" in compare  # the --no-memory folder, found automatically
    plots = re.findall(r'<img src="(/evals/0/plots/\w+)"', page.text)
    assert [p.rsplit("/", 1)[1] for p in plots] == ["per_task_f1", "cost_vs_f1", "learning_curve", "hint_pool"]
    image = client.get(plots[0])
    assert image.status_code == 200 and image.content.startswith(b"\x89PNG")
    assert not (world / "ev-on" / "report.md").exists()  # drawn in the server's cache, never in the folder
    alone = client.get("/evals/0", params={"compare": "none"}).text
    assert "memory off" not in alone.split('id="compare"')[1].split("</table>")[0]
    assert client.get("/evals/0", params={"compare": "0"}).status_code == 400
    assert client.get("/evals/0", params={"compare": "x"}).status_code == 400
    assert client.get("/evals/0/plots/secrets").status_code == 400


def test_timeline_lays_out_every_attempt_of_every_execution(tmp_path: Path) -> None:
    events = [
        {"ts": 100.0, "event": "run_start", "batches": [{"batch_id": "batch-001"}, {"batch_id": "batch-002"}]},
        {"ts": 102.0, "event": "attempt", "batch_id": "batch-001", "phase": "map", "attempt": 1, "outcome": "timeout",
         "elapsed_s": 2.0, "error": "BatchTimeout: <slow>"},
        {"ts": 101.5, "event": "model_retry", "batch_id": "batch-001", "retry": 1, "kind": "rate_limit", "delay_s": 0.5},
        {"ts": 101.8, "event": "model_hedge", "batch_id": "batch-001", "winner": "hedge", "after_s": 0.3},
        {"ts": 103.0, "event": "attempt", "batch_id": "batch-001", "phase": "map", "attempt": 2, "outcome": "ok",
         "elapsed_s": 1.0},
        {"ts": 103.0, "event": "patch_round", "round": 1, "batches": [{"batch_id": "patch1.1-batch-001"}]},
        {"ts": 104.0, "event": "run_start", "batches": [{"batch_id": "batch-001"}]},
        {"ts": 110.0, "event": "attempt", "batch_id": "batch-001", "phase": "map", "attempt": 1, "outcome": "parse_error",
         "elapsed_s": 4.0},
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(e) + "\n" for e in events) + '{"ts": 1, "event": "attem', encoding="utf-8")
    timeline = read_timeline(trace)
    assert timeline is not None
    assert [lane.label for lane in timeline.lanes] == ["1:batch-001", "1:batch-002", "2:batch-001"]
    assert [b.outcome for b in timeline.bars] == ["timeout", "ok", "parse_error"]
    assert timeline.counts == {"timeout": 1, "ok": 1, "parse_error": 1, "retries": 1, "hedges": 1, "patch_rounds": 1}
    assert timeline.span_s == 10.0  # from the first attempt's start (100 s) to the last one's end (110 s)
    first, second, third = timeline.bars
    assert first.x == LABEL_WIDTH and third.x + third.width == LABEL_WIDTH + PLOT_WIDTH
    assert second.width == PLOT_WIDTH / 10 and first.y == second.y < third.y
    assert "BatchTimeout: <slow>" in first.title and [m.kind for m in timeline.marks] == ["retry", "hedge", "patch"]
    assert [t.label for t in timeline.ticks] == ["0 s", "2 s", "4 s", "6 s", "8 s", "10 s"]
    assert read_timeline(tmp_path / "none.jsonl") is None


def test_the_table_can_show_the_least_sure_rows_first_and_only_those_below_a_confidence(world: Path, tmp_path: Path) -> None:
    """Issue 27 point 4: each cell's confidence (recorded in `result.json`) is in its hover text, and the Run
    page orders rows by their least sure cell or keeps only rows with a cell below a confidence."""
    runs_dir = tmp_path / "runs"
    folder = runs_dir / "20990101-000001-sure"
    sure = {0.9: "verified", 0.6: "no_evidence", 0.3: "unverified"}  # the table's rule gives these confidences

    def checked(value: str, confidence: float) -> dict[str, object]:
        made = cell(value, "found", "https://example.org", quote=value if confidence != 0.6 else None,
                    evidence=Evidence(sure[confidence]))
        assert made["confidence"] == confidence
        return made

    rows = [{"task_index": i, "cells": {"Name": checked(name, 0.9), "Capital": checked(capital, confidence)}}
            for i, (name, capital, confidence) in enumerate([("Austria", "Vienna", 0.9), ("Malta", "Rabat", 0.3),
                                                              ("Estonia", "Tallinn", 0.6)])]
    write_record(folder, query="capitals", completeness={"rows": 3},
                 table={"columns": ["Name", "Capital"], "key_columns": ["Name"], "rows": rows})
    client = TestClient(create_app(_config(world, runs_dir=runs_dir)), base_url=LOCAL)

    def shown(query: str) -> list[tuple[str, str]]:
        page = client.get(f"/runs/{folder.name}{query}")
        assert page.status_code == 200
        body = page.text.split('id="result-table"')[1].split("</tbody>")[0]
        return re.findall(r'<td class="n muted">(\d+)</td>\s*<td[^>]*>([A-Za-z]+)', body)

    assert shown("") == [("1", "Austria"), ("2", "Malta"), ("3", "Estonia")]
    assert shown("?order=confidence") == [("2", "Malta"), ("3", "Estonia"), ("1", "Austria")]  # numbers stay the table's
    assert shown("?order=confidence&below=0.65") == [("2", "Malta"), ("3", "Estonia")]
    assert shown("?below=0.5") == [("2", "Malta")]
    assert "confidence 0.3" in client.get(f"/runs/{folder.name}").text  # in the cell's hover text
    assert client.get(f"/runs/{folder.name}?below=2").status_code == 400
    assert client.get(f"/runs/{folder.name}?order=random").status_code == 400
