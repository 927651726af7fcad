"""The pages and forms of `amapreduce ui`.

Reads are GET and change nothing. The memory edits are POST forms that carry the CSRF token and
are applied only after a confirmation page (the form posted again with `confirm=yes`). Every
path taken from the URL goes through `security.contained` before a file is opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Route

import amapreduce.ui.evaluation as evaluation  # not `from amapreduce.ui`: its __init__ imports ui.app
import amapreduce.ui.memory as memory
import amapreduce.ui.runs as runs
from amapreduce.ui.config import UIConfig
from amapreduce.ui.security import MAX_FORM_BYTES, check_csrf, contained, parse_form

__all__ = ["ROUTES"]

_STYLE = Path(__file__).parent / "static" / "style.css"
_DONE = {"edited": "The hint was edited.", "removed": "The hint was removed.", "pruned": "Pruned."}
"""The notices a redirect after a memory edit may ask for (`?done=`); nothing else is shown."""


def _config(request: Request) -> UIConfig:
    config: UIConfig = request.app.state.config
    return config


def _page(request: Request, template: str, context: dict[str, Any], status: int = 200) -> Response:
    """A page, with what every page needs: the section for the navigation and the CSRF token."""
    config = _config(request)
    section = template.split(".")[0].split("_")[0].rstrip("s")  # run(s) → run, evals_one → eval, memory_item → memory
    base = {"csrf": request.app.state.csrf, "has_evals": bool(config.evals), "section": section}
    response: Response = request.app.state.templates.TemplateResponse(request, template, {**base, **context},
                                                                      status_code=status)
    return response


def home(request: Request) -> Response:
    return RedirectResponse("/runs", status_code=303)


def no_icon(request: Request) -> Response:
    """Browsers ask for a favicon on every first visit; there is none."""
    return Response(status_code=204)


def style(request: Request) -> Response:
    return Response(_STYLE.read_text(encoding="utf-8"), media_type="text/css")


def runs_page(request: Request) -> Response:
    state = request.query_params.get("status") or None
    return _page(request, "runs.html", runs.runs_view(_config(request).runs_dir, state))


_LABELS = {"csv": "CSV", "jsonl": "JSONL", "md": "Markdown"}


def _run_page(request: Request, folder: Path, download: str, back: str) -> Response:
    """The Run page of `folder`; `download` is its downloads' URL with `{fmt}` for the format."""
    order = request.query_params.get("order") or "matrix"
    if order not in runs.TABLE_ORDERS:
        raise HTTPException(400, f"unknown order {order!r}: use {' or '.join(runs.TABLE_ORDERS)}.")
    below = _fraction(request.query_params.get("below"))
    view = runs.run_view(folder, order=order, below=below)
    links = [(_LABELS[fmt], download.replace("{fmt}", fmt)) for fmt in view.downloads]
    return _page(request, "run.html", {"view": view, "downloads": links, "back": back})


def _fraction(raw: str | None) -> float | None:
    """A `?below=` confidence: a number in [0, 1], or None when absent or empty."""
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise HTTPException(400, f"below={raw!r} is not a confidence: give a number from 0 to 1.")
    return value


def _download(folder: Path, fmt: str) -> Response:
    name, media, text = runs.download(folder, fmt)
    return Response(text, media_type=f"{media}; charset=utf-8",
                    headers={"content-disposition": f'attachment; filename="{folder.name}-{name}"'})


def run_page(request: Request) -> Response:
    name = request.path_params["name"]
    folder = contained(_config(request).runs_dir, name)
    return _run_page(request, folder, f"/runs/{quote(name)}/download/{{fmt}}", "/runs")


def run_download(request: Request) -> Response:
    folder = contained(_config(request).runs_dir, request.path_params["name"])
    return _download(folder, request.path_params["fmt"])


def _eval_folder(request: Request) -> tuple[int, Path]:
    index: int = request.path_params["index"]
    folders = _config(request).evals
    if not 0 <= index < len(folders):
        raise HTTPException(404, f"no evaluation {index}: this server shows {len(folders)}.")
    return index, folders[index]


def _compare(request: Request) -> int | None:
    raw = request.query_params.get("compare")
    if raw in (None, ""):
        return None
    if raw == "none":
        return evaluation.NO_COMPARE
    try:
        return int(raw)
    except ValueError:
        raise HTTPException(400, f"compare must be an evaluation number or none, got {raw!r}.") from None


def evals_page(request: Request) -> Response:
    return _page(request, "evals.html", {"evals": evaluation.eval_list(_config(request).evals)})


def eval_page(request: Request) -> Response:
    index, _ = _eval_folder(request)
    config = _config(request)
    compare = _compare(request)
    view = evaluation.eval_view(config.evals, index, compare=compare, plot_dir=config.plot_dir)
    return _page(request, "evals_one.html", {"view": view, "compare": request.query_params.get("compare") or ""})


def eval_plot(request: Request) -> Response:
    index, _ = _eval_folder(request)
    config = _config(request)
    file = evaluation.plot_file(config.evals, index, request.path_params["plot"], compare=_compare(request),
                                plot_dir=config.plot_dir)
    return FileResponse(file, media_type="image/png")


def eval_run_page(request: Request) -> Response:
    index, folder = _eval_folder(request)
    relative = request.path_params["path"]
    run_folder = contained(folder, relative)
    return _run_page(request, run_folder, f"/evals/{index}/download/{{fmt}}/{quote(relative)}", f"/evals/{index}")


def eval_run_download(request: Request) -> Response:
    _, folder = _eval_folder(request)
    return _download(contained(folder, request.path_params["path"]), request.path_params["fmt"])


def memory_page(request: Request) -> Response:
    contains = request.query_params.get("contains") or None
    sort = request.query_params.get("sort") or "default"
    folder = _config(request).memory
    view = memory.memory_view(folder, contains=contains, sort=sort)
    done = _DONE.get(request.query_params.get("done") or "")
    return _page(request, "memory.html", {"view": view, "store": str(folder), "contains": contains or "",
                                          "sort": sort, "done": done})


def memory_search(request: Request) -> Response:
    query = (request.query_params.get("q") or "").strip()
    task_id = (request.query_params.get("task_id") or "").strip()
    if not query:
        raise HTTPException(400, "give a question to search for (q=...).")
    result = memory.search_view(_config(request).memory, query, task_id=task_id or None)
    return _page(request, "memory_search.html", {"query": query, "task_id": task_id, "result": result,
                                                 "store": str(_config(request).memory)})


def memory_item(request: Request) -> Response:
    item = memory.item_view(_config(request).memory, request.path_params["item_id"])
    done = _DONE.get(request.query_params.get("done") or "")
    return _page(request, "memory_item.html", {"item": item, "done": done})


async def _form(request: Request) -> dict[str, str]:
    """The posted form, checked: urlencoded, not too large, carrying this server's CSRF token."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        raise HTTPException(415, "send the form as application/x-www-form-urlencoded.")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            break
    form = parse_form(body)
    check_csrf(form, request.app.state.csrf)
    return form


def _confirm(request: Request, *, title: str, action: str, fields: dict[str, str], **context: Any) -> Response:
    return _page(request, "memory_confirm.html", {"title": title, "action": action, "fields": fields, **context})


async def hint_edit(request: Request) -> Response:
    form = await _form(request)
    hint_id = request.path_params["hint_id"]
    folder = _config(request).memory
    plan = await run_in_threadpool(memory.plan_edit, folder, hint_id, text=form.get("text", ""),
                                   score=form.get("score", ""))
    if form.get("confirm") != "yes":
        return _confirm(request, title=f"Edit hint {hint_id}?", action=f"/memory/hints/{quote(hint_id)}/edit",
                        fields={"text": plan.text_after, "score": str(plan.w_after)}, plan=plan)
    await run_in_threadpool(memory.apply_edit, folder, plan)
    return RedirectResponse(f"/memory/items/{quote(hint_id)}?done=edited", status_code=303)


async def hint_remove(request: Request) -> Response:
    form = await _form(request)
    hint_id = request.path_params["hint_id"]
    folder = _config(request).memory
    if form.get("confirm") != "yes":
        item = await run_in_threadpool(memory.item_view, folder, hint_id)
        if item.get("type") != "hint":
            raise HTTPException(400, f"{hint_id} is a record; only hints can be removed here.")
        return _confirm(request, title=f"Remove hint {hint_id}?", action=f"/memory/hints/{quote(hint_id)}/remove",
                        fields={}, item=item)
    await run_in_threadpool(memory.apply_remove, folder, hint_id)
    return RedirectResponse("/memory?done=removed", status_code=303)


async def hints_prune(request: Request) -> Response:
    form = await _form(request)
    folder = _config(request).memory
    threshold, doomed = await run_in_threadpool(memory.plan_prune, folder, form.get("threshold", "0"))
    if form.get("confirm") != "yes":
        return _confirm(request, title=f"Prune {len(doomed)} hints with w <= {threshold}?", action="/memory/prune",
                        fields={"threshold": str(threshold)}, doomed=doomed)
    await run_in_threadpool(memory.apply_prune, folder, threshold)
    return RedirectResponse("/memory?done=pruned", status_code=303)


ROUTES = [
    Route("/", home),
    Route("/static/style.css", style),
    Route("/favicon.ico", no_icon),
    Route("/runs", runs_page),
    Route("/runs/{name}", run_page),
    Route("/runs/{name}/download/{fmt}", run_download),
    Route("/evals", evals_page),
    Route("/evals/{index:int}", eval_page),
    Route("/evals/{index:int}/plots/{plot}", eval_plot),
    Route("/evals/{index:int}/run/{path:path}", eval_run_page),
    Route("/evals/{index:int}/download/{fmt}/{path:path}", eval_run_download),
    Route("/memory", memory_page),
    Route("/memory/search", memory_search),
    Route("/memory/items/{item_id}", memory_item),
    Route("/memory/hints/{hint_id}/edit", hint_edit, methods=["POST"]),
    Route("/memory/hints/{hint_id}/remove", hint_remove, methods=["POST"]),
    Route("/memory/prune", hints_prune, methods=["POST"]),
]
"""Every page and form of the UI."""
