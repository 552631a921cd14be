"""Documentation that can be read without running anything: the static site (tools/docs.py) opened in a real headless
Chromium, and the committed-output checks (tools/nb_outputs.py) on hand-made notebooks and on nbs/ itself.

The browser part needs Debian's `chromium` (`apt-get install -y --no-install-recommends chromium`); without it
those tests are skipped with a message saying so. Nothing here reaches the network: the pages are served from
127.0.0.1 by a server each test starts and stops, and Chromium resolves no other host.
"""
from __future__ import annotations

import asyncio
import functools
import html
import json
import os
import re
import signal
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import docs  # noqa: E402
import nb_outputs  # noqa: E402

TRACEBACK = "Traceback (most recent call last)"
CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium", shutil.which("chromium-browser")) if p and Path(p).exists()), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium: `apt-get install -y --no-install-recommends chromium` to run the browser checks")


# ---------------------------------------------------------------- a server and a browser

class Server:
    "Serve a folder on 127.0.0.1 (a free port) in a thread; stopped on exit."

    def __init__(self, folder: Path):
        handler = functools.partial(_QuietHandler, directory=str(folder))
        self.httpd = _QuietServer(("127.0.0.1", 0), handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError): super().handle_error(request, client_address)


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args): pass


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_status(url: str) -> int:
    try:
        with _NO_PROXY.open(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


PAGE_JS = """JSON.stringify({
  title: document.title,
  h1: (document.querySelector('main header h1') || {innerText: ''}).innerText,
  text: document.body ? document.body.innerText : '',
  shown: (() => { const b = document.body.cloneNode(true);   // what the page shows besides the code it quotes
                  b.querySelectorAll('.input_area, .jp-InputArea').forEach(e => e.remove()); return b.textContent; })(),
  sidebar: [...document.querySelectorAll('nav.sidebar li a')].map(a => ({href: a.href, text: a.innerText.trim()})),
  links: [...document.querySelectorAll('main a[href]')].map(a => a.href)
})"""


def browse(urls: list[str], timeout: float = 30) -> dict[str, dict]:
    "Open each URL in one headless Chromium (DevTools protocol) and return what PAGE_JS sees there."
    return asyncio.run(_browse(urls, timeout))


async def _browse(urls, timeout):
    import aiohttp
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--no-default-browser-check", "--no-proxy-server", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            port_file, t0 = Path(profile) / "DevToolsActivePort", time.time()
            while not (port_file.exists() and port_file.read_text().strip()):
                if proc.poll() is not None or time.time() - t0 > timeout:
                    raise RuntimeError(f"chromium did not start (exit {proc.poll()})")
                await asyncio.sleep(0.1)
            port = int(port_file.read_text().split()[0])
            async with aiohttp.ClientSession() as http:
                for _ in range(50):
                    targets = await (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
                    pages = [t for t in targets if t.get("type") == "page"]
                    if pages: break
                    await asyncio.sleep(0.1)
                async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    cdp = _Cdp(ws)
                    await cdp.call("Page.enable")
                    out = {}
                    for url in urls:
                        await cdp.navigate(url, timeout)
                        r = await cdp.call("Runtime.evaluate", expression=PAGE_JS, returnByValue=True)
                        out[url] = json.loads(r["result"]["value"])
                    return out
        finally:  # stop this Chromium and its helper processes (its own process group), nothing else
            proc.terminate()
            try: proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill(); proc.wait(10)
            try: os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError): pass


class _Cdp:
    "The smallest DevTools-protocol client: numbered calls, and waiting for an event."

    def __init__(self, ws):
        self.ws, self.n, self.events = ws, 0, []

    async def _recv(self):
        msg = await self.ws.receive_json()
        if "method" in msg: self.events.append(msg)
        return msg

    async def call(self, method, **params):
        self.n += 1
        await self.ws.send_json({"id": self.n, "method": method, "params": params})
        while True:
            msg = await self._recv()
            if msg.get("id") == self.n:
                if "error" in msg: raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def navigate(self, url, timeout):
        self.events.clear()
        r = await self.call("Page.navigate", url=url)
        if r.get("errorText"): raise RuntimeError(f"{url}: {r['errorText']}")
        async def loaded():
            while not any(e["method"] == "Page.loadEventFired" for e in self.events): await self._recv()
        await asyncio.wait_for(loaded(), timeout)


def audit(folder: Path) -> dict:
    """Open every page of a built site in Chromium; return the problems found, by kind: sidebar links that do not
    resolve (HTTP status, or the page there lacks the link's title), pages showing a traceback, broken in-site links."""
    pages = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.html"))
    found = {"sidebar": [], "traceback": [], "links": [], "untitled": []}
    with Server(folder) as srv:
        seen = browse([srv.base + p for p in pages])
        sidebar = {}
        for url, info in seen.items():
            if TRACEBACK in info["shown"]: found["traceback"].append(url[len(srv.base):])
            if not info["title"] or not info["h1"]: found["untitled"].append(url[len(srv.base):])
            for a in info["sidebar"]: sidebar.setdefault(a["href"], a["text"])
        status = {u: http_status(u) for u in sidebar}
        targets = browse([u for u in sidebar if status[u] == 200])
        for u, text in sidebar.items():
            rel = u[len(srv.base):]
            if status[u] != 200:
                found["sidebar"].append(f"{rel}: HTTP {status[u]}")
            elif text not in (targets[u]["h1"], targets[u]["title"]) and text != targets[u]["title"].split(" – ")[0]:
                found["sidebar"].append(f"{rel}: link says {text!r}, page is titled {targets[u]['title']!r}")
        inside = {l.split("#")[0] for info in seen.values() for l in info["links"] if l.startswith(srv.base)}
        for u in sorted(inside):
            if http_status(u) != 200: found["links"].append(u[len(srv.base):])
    return found


# ---------------------------------------------------------------- hand-made notebooks

def make_nb(path: Path, cells: list, title: str | None = None):
    "Write a notebook: `cells` are (kind, source) or (kind, source, outputs)."
    import nbformat as nbf
    nb = nbf.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if title: nb.cells.append(nbf.v4.new_markdown_cell(f"# {title}\n\n> What {title} is for."))
    for c in cells:
        kind, src, outs = (c + ([],))[:3] if len(c) == 2 else c
        if kind == "md": nb.cells.append(nbf.v4.new_markdown_cell(src))
        else: nb.cells.append(nbf.v4.new_code_cell(src, outputs=[nbf.from_dict(o) for o in outs]))
    path.parent.mkdir(parents=True, exist_ok=True)
    nbf.write(nb, path)
    return path


def out_text(text):
    return {"output_type": "stream", "name": "stdout", "text": text}


def out_result(text):
    return {"output_type": "execute_result", "execution_count": None, "metadata": {}, "data": {"text/plain": text}}


def out_error():
    return {"output_type": "error", "ename": "ValueError", "evalue": "boom",
            "traceback": [TRACEBACK + ":", '  File "<cell>", line 1', "ValueError: boom"]}


PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


@pytest.fixture
def mini(tmp_path):
    "A tiny project: three notebooks (one with an error output), a sidebar naming one that does not exist, a README."
    nbs = tmp_path / "nbs"
    make_nb(nbs / "01_good.ipynb", [
        ("md", "Some **bold** text and a [link to the other one](02_bad.ipynb#part), and $x^2$."),
        ("code", "#| hide\nSECRET_SETUP = 1"),
        ("code", "#| export\ndef hidden_export(): pass"),
        ("code", "#| echo: false\nprint('only the output')", [out_text("only the output\n")]),
        ("code", "x = [1, 2, 3]\nx", [out_result("[1, 2, 3]")]),
        ("code", "plot()", [{"output_type": "display_data", "metadata": {}, "data": {"image/png": PNG_1PX, "text/plain": "<Figure>"}}]),
        ("md", "## A section\n\n| a | b |\n|---|---|\n| 1 | 2 |"),
        ("code", "show_doc(len)", [{"output_type": "display_data", "metadata": {}, "data": {
            "text/markdown": '---\n\n[source](https://example.org/len.py#L1){target="_blank" style="float:right"}\n\n### len\n\n*Return the length.*',
            "text/plain": "<nbdev.showdoc.BasicMarkdownRenderer>"}}]),
    ], title="Good notebook")
    make_nb(nbs / "02_bad.ipynb", [("code", "1/0", [out_error()])], title="Bad notebook")
    make_nb(nbs / "tutorials" / "walk.ipynb", [("md", "Back to [the good one](../01_good.ipynb)."),
                                               ("code", f"log = '{TRACEBACK}:'  # quoting one in code is fine")], title="A walk")
    (nbs / "sidebar.yml").write_text(
        "website:\n  sidebar:\n    contents:\n      - index.ipynb\n      - section: Core\n        contents:\n"
        "          - 01_good.ipynb\n          - 02_bad.ipynb\n          - 03_missing.ipynb\n"
        "      - section: Tutorials\n        contents:\n          - tutorials/walk.ipynb\n")
    (tmp_path / "settings.ini").write_text("[DEFAULT]\n")
    (tmp_path / "README.md").write_text("<!-- generated -->\n\n# Mini project\n\n> The front page.\n\nSee [the good notebook](nbs/01_good.ipynb) "
                                        "and [the settings](settings.ini).\n")
    return tmp_path


def test_docs_build_of_a_mini_project(mini):
    out = mini / "_docs"
    res = docs.build_site(out=out, nbs=mini / "nbs", readme=mini / "README.md", api=False)
    assert res["problems"] == ["sidebar entry '03_missing.ipynb' names no notebook in " + str((mini / "nbs").absolute())]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html")) == [
        "01_good.html", "02_bad.html", "index.html", "tutorials/walk.html"]
    good = (out / "01_good.html").read_text()
    assert "<title>Good notebook – composer_replication</title>" in good
    assert "What Good notebook is for." in good                       # the frontmatter description
    assert "SECRET_SETUP" not in good and "hidden_export" not in good  # #| hide and #| export cells are gone
    assert "#|" not in good and "print(&#39;only" not in good and "print('only" not in good  # directives, echo: false
    assert "only the output" in good
    assert '<strong>bold</strong>' in good and "<table>" in good
    assert 'href="02_bad.html#part"' in good                          # foo.ipynb -> foo.html
    assert "<em>Return the length.</em>" in good and '{target=' not in good and "show_doc(" not in good  # a show_doc cell
    assert 'highlight hl-ipython3' in good and "data:image/png;base64," + PNG_1PX[:20] in good
    walk = (out / "tutorials" / "walk.html").read_text()
    assert 'href="../01_good.html"' in walk and 'href="../site.css"' in walk
    front = (out / "index.html").read_text()
    assert "<h1>Mini project</h1>" in front and 'href="01_good.html"' in front
    assert "https://github.com/" in front and "/blob/main/settings.ini" in front  # not rendered: a link to the repo
    assert docs.main(["--out", str(out), "--nbs", str(mini / "nbs"), "--readme", str(mini / "README.md"), "--no-api"]) == 1


def test_docs_refuses_to_wipe_a_folder_it_did_not_write(mini):
    out = mini / "precious"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit, match="refusing to wipe"):
        docs.build_site(out=out, nbs=mini / "nbs", readme=mini / "README.md", api=False)
    assert (out / "keep.txt").read_text() == "mine"


@needs_chromium
def test_browser_audit_finds_what_is_wrong_with_the_mini_site(mini):
    "The audit used on the real site can fail: a missing sidebar page, a traceback on a page."
    out = mini / "_docs"
    docs.build_site(out=out, nbs=mini / "nbs", readme=mini / "README.md", api=False)
    found = audit(out)
    assert found["sidebar"] == ["03_missing.html: HTTP 404"]
    assert found["traceback"] == ["02_bad.html"]
    assert found["links"] == [] and found["untitled"] == []


def test_api_docs_of_a_module_that_does_not_import(tmp_path):
    "A module that fails to import still gets its names, signatures and first docstring lines, read from the source."
    from nbconvert.filters.markdown_mistune import markdown2html_mistune
    (tmp_path / "brokenmod_xyz.py").write_text(
        "import a_package_that_is_not_installed_xyz\n__all__ = ['f', 'K']\n"
        "def f(a, b: int = 1):\n    '''Add things.\n\n    More text.'''\n    return a\nK = 3\n")
    api = docs.ApiDocs("x", "https://github.com/o/r", "main", markdown2html_mistune, tmp_path / "lib")
    assert api.public_names("brokenmod_xyz", api.py_file("brokenmod_xyz")) == ["f", "K"]
    box = api.html("brokenmod_xyz", "f")
    assert "ModuleNotFoundError" in api.errors["brokenmod_xyz"] and TRACEBACK not in box
    text = html.unescape(re.sub(r"<[^>]+>", "", box))
    assert "def f(a, b: int=1)" in text and "<em>Add things.</em>" in box and "More text" not in box
    assert api.html("brokenmod_xyz", "K") == ""  # not a def: the API page gives it a bare heading


def test_sidebar_reading():
    items = docs.read_sidebar(ROOT / "nbs" / "sidebar.yml")
    links = docs.sidebar_links(items)
    assert links and all(l.endswith(".ipynb") for l in links)
    assert [k for k, *_ in items].count("section") >= 3


# ---------------------------------------------------------------- the real site

@pytest.fixture(scope="module")
def real_site(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs") / "_docs"
    res = docs.build_site(out=out)
    return out, res


@pytest.mark.slow
def test_real_site_builds(real_site):
    out, res = real_site
    nbs = [p for p in docs.find_notebooks(ROOT / "nbs") if p.name != "index.ipynb"]
    for p in nbs:
        assert (out / p.relative_to(ROOT / "nbs").with_suffix(".html")).exists(), p
    assert (out / "index.html").exists() and res["api_pages"] > 10
    assert not [p for p in res["problems"] if p.startswith("could not render")], res["problems"]
    api = (out / "api" / "composer_replication.opsd.html").read_text()
    assert "generalized_jsd_loss" in api and "api-doc" in api  # show_doc output
    assert re.search(r'href="https://github.com/[^"]+/blob/main/composer_replication/opsd.py#L\d+">source</a>', api)
    opsd = (out / "01_opsd.html").read_text()
    assert 'id="generalized_jsd_loss"' in opsd and "api/composer_replication.opsd.html" in opsd  # inline show_doc
    assert res["bytes"] < 30e6


@pytest.mark.slow
@needs_chromium
def test_real_site_in_a_browser(real_site):
    "Every sidebar link resolves to a page with that title; no page shows a traceback; in-site links resolve."
    out, _ = real_site
    found = audit(out)
    assert found == {"sidebar": [], "traceback": [], "links": [], "untitled": []}


# ---------------------------------------------------------------- nb_outputs

def test_check_flags_error_outputs(tmp_path):
    nb = make_nb(tmp_path / "err.ipynb", [("code", "x = 1"), ("code", "1/0", [out_error()])])
    problems = nb_outputs.check_notebook(nb)
    assert len(problems) == 1 and "err.ipynb: cell 1" in problems[0] and "error output ValueError: boom" in problems[0]
    tb = make_nb(tmp_path / "tb.ipynb", [("code", "import traceback\ntraceback.print_exc()", [out_text(TRACEBACK + ":\n  ...\n")])])
    assert "shows a Python traceback" in nb_outputs.check_notebook(tb)[0]


def test_check_flags_missing_outputs(tmp_path):
    nb = make_nb(tmp_path / "missing.ipynb", [
        ("code", "x = 2"),            # 0: nothing to show
        ("code", "x"),                # 1: bare expression, no output -> problem
        ("code", "print(x)"),         # 2: print, no output -> problem
        ("code", "show_doc(len)"),    # 3: show_doc cell -> problem
        ("code", "test_eq(x, 2)"),    # 4: a call that returns None: not required
        ("code", "x;"),               # 5: silenced
        ("code", "def f():\n    print('later')"),  # 6: print inside a def
        ("code", "if x > 5:\n    print(x)"),        # 7: conditional print
        ("code", "#| eval: false\nx"),               # 8: not executed
        ("code", "#| notest\nx"),                    # 9: not executed (tst_flags)
        ("code", "#| output: false\nx"),             # 10: output hidden on purpose
        ("code", "%time x"),                         # 11: a magic: a call
        ("code", "for i in range(2):\n    display(i)"),  # 12: display in a loop -> problem
        ("code", "x == 2"),                          # 13: a comparison shows True -> problem
    ])
    problems = nb_outputs.check_notebook(nb)
    cells = [int(p.split(": cell ")[1].split()[0]) for p in problems]
    assert cells == [1, 2, 3, 12, 13], problems
    assert all("missing.ipynb" in p and "none is committed" in p for p in problems)


def test_check_passes_a_good_notebook(tmp_path):
    nb = make_nb(tmp_path / "good.ipynb", [
        ("md", "# Good"), ("code", "x = 2"), ("code", "x", [out_result("2")]), ("code", "print(x)", [out_text("2\n")]),
        ("code", "#| slow\nprint('slow')", [out_text("slow\n")]), ("code", "test_eq(x, 2)"),
    ])
    assert nb_outputs.check_notebook(nb) == []
    assert nb_outputs.main(["check", str(nb)]) == 0
    bad = make_nb(tmp_path / "bad.ipynb", [("code", "x")])
    assert nb_outputs.main(["check", str(nb), str(bad)]) == 1


def test_trim_outputs():
    long = "".join(f"line {i}\n" for i in range(500))
    [o] = nb_outputs.trim_outputs([out_text(long)], max_lines=20, max_chars=10_000)
    lines = o["text"].splitlines()
    assert len(lines) == 21 and lines[0] == "line 0" and lines[-1] == "line 499" and lines[15].startswith("… (truncated: 480 more lines")
    [o] = nb_outputs.trim_outputs([out_text("x" * 5000)], max_chars=1000)
    assert len(o["text"]) < 1100 and "… (truncated: 4000 more characters)" in o["text"]
    bar = "".join(f"\r{i}%" for i in range(101)) + "\n"
    assert nb_outputs.trim_outputs([out_text(bar)])[0]["text"] == "100%\n"  # a progress bar as a terminal shows it
    big = {"output_type": "display_data", "metadata": {}, "data": {"image/png": "A" * 300_000, "text/plain": "<Figure>"}}
    small = {"output_type": "display_data", "metadata": {}, "data": {"image/png": PNG_1PX}}
    html = {"output_type": "execute_result", "metadata": {}, "execution_count": None,
            "data": {"text/html": "<td>1</td>" * 10_000, "text/plain": "table"}}
    o1, o2, o3 = nb_outputs.trim_outputs([big, small, html], max_image=150_000, max_data=30_000)
    assert "image/png" not in o1["data"] and "image/png output of 300 KB dropped" in o1["data"]["text/plain"]
    assert o2["data"]["image/png"] == PNG_1PX
    assert "text/html" not in o3["data"] and o3["data"]["text/plain"].startswith("table\n[text/html output of 100 KB dropped")


@pytest.mark.slow
def test_execute_in_place_keeps_trimmed_outputs_and_is_clean(tmp_path):
    nb = make_nb(tmp_path / "run.ipynb", [
        ("code", "#| export\ndef double(x): return 2 * x"),
        ("code", "double(21)"),
        ("code", "for i in range(300): print(i)"),
        ("code", "#| slow\nprint('slow ran')"),
        ("code", "#| eval: false\nprint('never')"),
        ("code", "#| notest\nprint('not a test')"),
    ], title="Run me")
    assert nb_outputs.main(["execute", str(nb), "--max-lines", "30"]) == 0
    d = json.loads(nb.read_text())
    outs = [c.get("outputs") for c in d["cells"] if c["cell_type"] == "code"]
    assert outs[0] == [] and outs[4] == [] and outs[5] == []
    assert "".join(outs[1][0]["data"]["text/plain"]) == "42"
    assert "… (truncated: 270 more lines)" in "".join(outs[2][0]["text"])
    assert outs[3][0]["text"] == ["slow ran\n"]
    before = nb.read_bytes()
    subprocess.run([str(Path(sys.executable).parent / "nbdev_clean"), "--fname", str(nb)], check=True, cwd=ROOT)
    assert nb.read_bytes() == before                      # what CI's nbdev_clean step checks
    assert nb_outputs.check_notebook(nb) == []
    failing = make_nb(tmp_path / "fail.ipynb", [("code", "print('a')"), ("code", "raise ValueError('planted')")])
    before = failing.read_bytes()
    assert nb_outputs.main(["execute", str(failing)]) == 1
    assert failing.read_bytes() == before                 # a failing notebook is not written


def test_settings_keep_outputs():
    "nbdev_clean (and CI's clean step) must keep outputs: `clear_all` must stay off."
    from nbdev.config import get_config
    assert not get_config(path=ROOT).clear_all


@pytest.mark.slow
def test_committed_notebook_outputs_are_fresh():
    "CI: every notebook is committed executed: no error output, no missing output (`python tools/nb_outputs.py execute` refreshes)."
    nbs = nb_outputs.find_notebooks([ROOT / "nbs"])
    assert len(nbs) > 40, nbs
    problems = [p for f in nbs for p in nb_outputs.check_notebook(f)]
    assert not problems, f"{len(problems)} problems, e.g.:\n" + "\n".join(problems[:20])
