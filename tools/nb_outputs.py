"""Keep the notebooks' executed outputs committed, small and fresh, so GitHub shows the evidence under every cell.

    python tools/nb_outputs.py execute [NB ...]   # run notebooks IN PLACE (slow cells too), trim outputs, nbdev-clean
    python tools/nb_outputs.py execute --fast     # ... skipping `#| slow` cells (their outputs are then empty)
    python tools/nb_outputs.py check [NB ...]     # CI: committed outputs have no error and none is missing; runs nothing

Without NB, every notebook under nbs/ (as nbdev globs them). `execute` runs each notebook in its own process with
execnb's `CaptureShell`, cell by cell exactly as nbdev's `test_nb` does (`tst_flags` honoured: `notest` cells are
skipped, `slow` cells run unless --fast; `#| eval: false` and `nbdev_export()` cells skipped), keeps the outputs,
trims them (text capped at --max-lines / --max-chars with a "… (truncated" marker, HTML and other data over
--max-data dropped, images over --max-image dropped, each with a note saying so), then cleans the file with
nbdev_clean's own code, so `nbdev_clean` afterwards changes nothing. A notebook whose cell fails is NOT written (the
error is printed with the notebook and cell); nor is one whose source changed on disk while it ran.

`check` fails (exit 1), naming notebook and cell, when a committed output is an error or shows a Python traceback,
or when a cell that clearly produces output has none: it ends with a bare expression (not a call, not ending in
`;`), or it calls print/display/show_doc unconditionally. Cells that `execute` skips, and `#| output: false`
cells, need no output.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACEBACK = "Traceback (most recent call last)"
TRUNC = "… (truncated"
OUTPUT_CALLS = {"print", "display", "show_doc", "pprint", "display_markdown", "display_html"}
LIMITS = dict(max_lines=60, max_chars=6000, max_data=30_000, max_image=150_000)


def _config():
    if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))
    from nbdev.config import get_config
    return get_config(path=ROOT)


def find_notebooks(paths=None) -> list[Path]:
    "The notebooks named (files or folders), else every notebook nbdev globs under nbs_path (`_`/`.` names skipped)."
    if not paths: paths = [_config().nbs_path]
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            for f in sorted(p.rglob("*.ipynb")):
                if not any(part.startswith(("_", ".")) for part in f.relative_to(p).parts): out.append(f)
        elif p.suffix == ".ipynb" and p.exists():
            out.append(p)
        else:
            raise SystemExit(f"not a notebook or folder: {p}")
    return out


def _flags(fast: bool, cfg=None) -> tuple[list[str], list[str]]:
    "(skip flags, force flags) the way tools/run_tests.py passes them to nbdev's test_nb."
    cfg = cfg or _config()
    skip = cfg.tst_flags.split()
    force = [] if fast else [f for f in skip if f != "notest"]
    return skip, force


def _skipped(cell, flags: set) -> bool:
    "Would nbdev's test_nb skip this cell? (`_no_eval` in nbdev.test)"
    if cell["cell_type"] != "code": return True
    src = _src(cell)
    if "nbdev_export" + "(" in src: return True
    d = _directives(src)
    if (d.get("eval:") or [""])[0].lower() == "false": return True
    return bool(flags & d.keys())


def _directives(src: str) -> dict:
    "nbdev's reading of a code cell's `#|` directives, e.g. {'export': [], 'eval:': ['false']}."
    from fastcore.basics import AttrDict
    from nbdev.process import extract_directives
    return extract_directives(AttrDict(source=src, cell_type="code"), remove=False) or {}


def _src(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def _text(v) -> str:
    return "".join(v) if isinstance(v, list) else (v or "")


# ---------------------------------------------------------------- trimming

def trim_text(text: str, max_lines: int, max_chars: int) -> str:
    "What a terminal would show (carriage-return progress bars collapsed), capped at `max_lines` and `max_chars`."
    ends = text.endswith("\n")
    lines = text.split("\n")[:-1] if ends else text.split("\n")
    lines = [l.rstrip("\r").rsplit("\r", 1)[-1] for l in lines]
    if len(lines) > max_lines:
        tail = min(5, max_lines // 4)
        n = len(lines) - max_lines
        lines = lines[:max_lines - tail] + [f"{TRUNC}: {n} more lines)"] + (lines[-tail:] if tail else [])
    text = "\n".join(lines) + ("\n" if ends else "")
    if len(text) > max_chars:
        cut = text.rfind("\n", 0, max_chars)
        cut = cut if cut > max_chars // 2 else max_chars
        text = text[:cut] + f"\n{TRUNC}: {len(text) - cut} more characters)" + ("\n" if text.endswith("\n") else "")
    return text


def _kb(n: int) -> str:
    return f"{n / 1000:.0f} KB"


def trim_outputs(outputs: list, max_lines=LIMITS["max_lines"], max_chars=LIMITS["max_chars"],
                 max_data=LIMITS["max_data"], max_image=LIMITS["max_image"]) -> list:
    "Outputs small enough to commit: long text capped, big HTML/data and big images dropped with a note."
    out = []
    for o in outputs:
        o = dict(o)
        kind = o.get("output_type")
        if kind == "stream":
            o["text"] = trim_text(_text(o.get("text")), max_lines, max_chars)
            if o["text"]: out.append(o)
            continue
        if kind not in ("display_data", "execute_result"):
            out.append(o)
            continue
        data, notes = dict(o.get("data") or {}), []
        for mime in list(data):
            val = data[mime]
            if mime.startswith("image/"):
                size = len(_text(val)) if mime == "image/svg+xml" else len(_text(val).replace("\n", ""))
                if size > max_image:
                    del data[mime]
                    notes.append(f"[{mime} output of {_kb(size)} dropped: over the {_kb(max_image)} limit]")
            elif mime == "text/plain":
                data[mime] = trim_text(_text(val), max_lines, max_chars)
            elif mime == "application/vnd.jupyter.widget-view+json":
                del data[mime]  # widgets do not render statically; their text/plain stays
            else:
                size = len(json.dumps(val)) if not isinstance(val, (str, list)) else len(_text(val))
                if size > max_data:
                    del data[mime]
                    notes.append(f"[{mime} output of {_kb(size)} dropped: over the {_kb(max_data)} limit]")
        if notes:
            plain = _text(data.get("text/plain"))
            data["text/plain"] = "\n".join(([plain] if plain else []) + notes)
        if not data: continue
        o["data"] = data
        out.append(o)
    return out


# ---------------------------------------------------------------- execute

def execute_one(path: Path, skip_flags: list[str], force_flags: list[str], limits: dict) -> dict:
    "Run one notebook in this process; write it back trimmed and clean unless a cell failed or the file changed."
    from execnb.nbio import read_nb
    from execnb.shell import CaptureShell
    from fastcore.xtras import working_directory
    from nbdev.clean import clean_nb
    from nbdev.frontmatter import FrontmatterProc
    from nbdev.process import NBProcessor, nb_lang
    from fastcore.basics import str2bool

    cfg = _config()
    if cfg.clear_all:
        return {"path": str(path), "ok": False, "error": "settings.ini has clear_all = True: nbdev_clean would drop every output"}
    path = Path(path).absolute()
    before = path.read_text(encoding="utf-8")
    sources = lambda text: [(c["cell_type"], _src(c)) for c in json.loads(text)["cells"]]
    fm = getattr(NBProcessor(path, procs=FrontmatterProc, process=True).nb, "frontmatter_", {})
    nb = read_nb(path)
    if str2bool(fm.get("skip_exec", False)) or nb_lang(nb) != "python":
        return {"path": str(path), "ok": True, "skipped": True, "secs": 0.0}
    os.environ.setdefault("IN_TEST", "1")  # as nbdev's test_nb, so outputs are what the tests see
    sys.path.insert(0, str(cfg.config_path))
    flags = set(skip_flags) - set(force_flags)
    t0 = time.time()
    k = CaptureShell(path, mpl_format="png")
    with working_directory(path.parent):
        for i, cell in enumerate(nb.cells):
            cell.idx_ = i
            if cell.cell_type != "code": continue
            cell.outputs = []
            if _skipped(cell, flags): continue
            k.cell(cell)
            if k.exc:
                tb = k.prettytb(fname=path)
                return {"path": str(path), "ok": False, "cell": i, "error": f"cell {i} failed:\n{tb}"}
            cell.outputs = trim_outputs(list(cell.get("outputs") or []), **limits)
    secs = time.time() - t0
    if sources(path.read_text(encoding="utf-8")) != sources(before):
        return {"path": str(path), "ok": False, "error": "the notebook's source changed on disk while it ran: not written"}
    d = _split_lines(json.loads(_nb2str(nb)))
    clean_nb(d, cfg.clear_all, cfg.get("allowed_metadata_keys").split(), cfg.get("allowed_cell_metadata_keys").split(),
             cfg.clean_ids)
    _write_like_nbdev_clean(d, path)
    return {"path": str(path), "ok": True, "secs": secs, "bytes": path.stat().st_size}


def _split_lines(nb: dict) -> dict:
    "Multi-line text as lists of lines, the way Jupyter saves it (so saving in Jupyter later changes nothing)."
    for c in nb.get("cells", []):
        for o in c.get("outputs", []) or []:
            if isinstance(o.get("text"), str): o["text"] = o["text"].splitlines(True)
            for k, v in (o.get("data") or {}).items():
                if k.startswith("text/") and isinstance(v, str): o["data"][k] = v.splitlines(True)
    return nb


def _nb2str(nb) -> str:
    from execnb.nbio import nb2str
    return nb2str(nb)


def _write_like_nbdev_clean(nb: dict, path: Path):
    "Write through a temporary file with nbdev_clean's writer (`execnb.nbio.write_nb`), then rename over `path`."
    from execnb.nbio import dict2nb, write_nb
    fd, tmp = tempfile.mkstemp(suffix=".ipynb", dir=path.parent, prefix=f".{path.stem}.")
    os.close(fd)
    os.unlink(tmp)
    try:
        write_nb(dict2nb(nb), tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp): os.unlink(tmp)


def execute(paths, fast=False, n_workers=2, timeout=None, limits=None) -> int:
    "Execute notebooks in parallel, one process each; print one line per notebook; 0 if all were written."
    limits = {**LIMITS, **(limits or {})}
    files = find_notebooks(paths)
    skip, force = _flags(fast)

    def run(f):
        cmd = [sys.executable, __file__, "_one", str(f), "--skip", " ".join(skip), "--force", " ".join(force),
               "--limits", json.dumps(limits)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"path": str(f), "ok": False, "error": f"timed out after {timeout}s: not written"}
        last = r.stdout.strip().splitlines()[-1:] or [""]
        try:
            return json.loads(last[0])
        except ValueError:
            return {"path": str(f), "ok": False, "error": f"worker exited {r.returncode}:\n{r.stderr[-3000:]}"}

    t0, bad = time.time(), 0
    with ThreadPoolExecutor(max(1, n_workers)) as ex:
        for res in ex.map(run, files):
            rel = _rel(res["path"])
            if res["ok"]:
                what = "skipped (skip_exec)" if res.get("skipped") else f"{res['secs']:6.1f}s  {res['bytes'] / 1000:7.1f} KB"
                print(f"  ok    {what}  {rel}", flush=True)
            else:
                bad += 1
                print(f"  FAIL  {rel}: {res['error']}", flush=True)
    print(f"executed {len(files) - bad} of {len(files)} notebooks in {time.time() - t0:.0f}s"
          + (f"; {bad} not written" if bad else ""))
    return 1 if bad else 0


def _rel(p) -> str:
    p = Path(p).absolute()
    try: return p.relative_to(ROOT).as_posix()
    except ValueError: return str(p)


# ---------------------------------------------------------------- check

def _call_name(node) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _prints(node) -> bool:
    "Does this call write to the notebook (print to stdout/stderr, display, show_doc)?"
    name = _call_name(node)
    if name not in OUTPUT_CALLS: return False
    if name == "print":
        for kw in node.keywords:
            if kw.arg == "file" and ast.unparse(kw.value) not in ("sys.stdout", "sys.stderr"): return False
    return True


def _unconditional_calls(stmts):
    "Calls in statements that always run: not inside def/class/lambda, if/else branches, except or try-else."
    for s in stmts:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): continue
        if isinstance(s, (ast.If, ast.Match)): continue
        if isinstance(s, (ast.For, ast.AsyncFor, ast.While)):
            yield from _expr_calls(s.iter if hasattr(s, "iter") else s.test)
            yield from _unconditional_calls(s.body)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            for it in s.items: yield from _expr_calls(it.context_expr)
            yield from _unconditional_calls(s.body)
        elif isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
            yield from _unconditional_calls(s.body)
            yield from _unconditional_calls(s.finalbody)
        else:
            yield from _expr_calls(s)


def _expr_calls(node):
    "Calls in an expression or simple statement, not descending into lambdas or comprehensions' conditions."
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.Lambda, ast.IfExp, ast.BoolOp)): continue
        if isinstance(n, ast.Call): yield n
        stack.extend(ast.iter_child_nodes(n))


def expects_output(source: str) -> bool:
    "Does this code cell clearly produce output? (bare final expression, or an unconditional print/display/show_doc)"
    from IPython.core.inputtransformer2 import TransformerManager
    try:
        code = TransformerManager().transform_cell(source)
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    if not tree.body: return False
    last = tree.body[-1]
    if isinstance(last, ast.Expr) and not code.rstrip().endswith(";"):
        v = last.value
        if not isinstance(v, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom)) and not (isinstance(v, ast.Constant) and v.value is None):
            return True
    return any(_prints(c) for c in _unconditional_calls(tree.body))


def check_notebook(path: Path, skip_flags=None, force_flags=None) -> list[str]:
    "Problems with one notebook's committed outputs, each naming the notebook and the cell."
    path = Path(path)
    rel = _rel(path)
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return [f"{rel}: cannot read the notebook: {e}"]
    if skip_flags is None: skip_flags, force_flags = _flags(False)
    flags = set(skip_flags) - set(force_flags or [])
    lang = ((nb.get("metadata") or {}).get("kernelspec") or {}).get("language", "python")
    if lang != "python" or _skip_exec(path): return []
    problems = []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code": continue
        src = _src(cell)
        where = f"{rel}: cell {i}" + (f" (id {cell['id']})" if cell.get("id") else "")
        first = next((l for l in src.splitlines() if l.strip() and not l.lstrip().startswith("#|")), "").strip()[:80]
        outs = cell.get("outputs") or []
        for o in outs:
            if o.get("output_type") == "error":
                problems.append(f"{where}: error output {o.get('ename')}: {str(o.get('evalue', ''))[:200]}  [{first}]")
            elif TRACEBACK in _text(o.get("text")) or any(TRACEBACK in _text(v) for k, v in (o.get("data") or {}).items() if k.startswith("text/")):
                problems.append(f"{where}: output shows a Python traceback  [{first}]")
        if outs or _skipped(cell, flags): continue
        d = _directives(src)
        if (d.get("output:") or [""])[0].lower() == "false": continue
        if expects_output(src):
            problems.append(f"{where}: produces output but none is committed (run tools/nb_outputs.py execute)  [{first}]")
    return problems


def _skip_exec(path: Path) -> bool:
    "The notebook's frontmatter says `skip_exec: true`."
    from fastcore.basics import str2bool
    from nbdev.frontmatter import FrontmatterProc
    from nbdev.process import NBProcessor
    try:
        fm = getattr(NBProcessor(path, procs=FrontmatterProc, process=True).nb, "frontmatter_", {})
    except Exception:  # noqa: BLE001 - a notebook nbdev cannot read is reported by the checks themselves
        return False
    return str2bool(fm.get("skip_exec", False))


def check(paths) -> int:
    "Check notebooks; print each problem; 0 if there are none."
    t0 = time.time()
    files = find_notebooks(paths)
    skip, force = _flags(False)
    problems = [p for f in files for p in check_notebook(f, skip, force)]
    for p in problems: print(p)
    print(f"checked the committed outputs of {len(files)} notebooks in {time.time() - t0:.1f}s: "
          + (f"{len(problems)} problems" if problems else "all fresh"))
    return 1 if problems else 0


# ---------------------------------------------------------------- CLI

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("execute", help="run notebooks in place, keep trimmed outputs, nbdev-clean them")
    ex.add_argument("paths", nargs="*")
    ex.add_argument("--fast", action="store_true", help="skip `#| slow` cells")
    ex.add_argument("--n-workers", type=int, default=min(os.cpu_count() or 1, 2))
    ex.add_argument("--timeout", type=float, default=None, help="seconds per notebook")
    for k, v in LIMITS.items(): ex.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    ck = sub.add_parser("check", help="fail on error outputs and on missing outputs; executes nothing")
    ck.add_argument("paths", nargs="*")
    one = sub.add_parser("_one", help=argparse.SUPPRESS)
    one.add_argument("path")
    one.add_argument("--skip", default="")
    one.add_argument("--force", default="")
    one.add_argument("--limits", default="{}")
    a = ap.parse_args(argv)
    if a.cmd == "check": return check(a.paths)
    if a.cmd == "execute":
        return execute(a.paths, a.fast, a.n_workers, a.timeout, {k: getattr(a, k) for k in LIMITS})
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    res = execute_one(Path(a.path), a.skip.split(), a.force.split(), json.loads(a.limits))
    sys.stdout.flush()
    print("\n" + json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
