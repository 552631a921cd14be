"""Open every page of the built site in a real headless Chromium and report what a reader would find wrong.

    python tools/docs_audit.py [_docs]    # what `bash tools/run.sh docs` runs after `mkdocs build`

Checks, by kind: `pages` a page that does not load or has no title or heading; `nav` a nav link that does not
resolve (HTTP status) or whose text is not the title of the page it opens; `traceback` a page that shows a Python
traceback outside the code it quotes; `links` an in-site link (in a page's content) that does not resolve; `console`
a JavaScript exception or console error (resources from other hosts are left out: the site is opened offline).
Needs Debian's `chromium` (`apt-get install -y --no-install-recommends chromium`). Nothing reaches the network: the
site is served from 127.0.0.1 by a server started here, and Chromium resolves no other host.
Exit status: 1 if anything was found, else 0 (also without Chromium, after saying the audit was skipped).
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TRACEBACK = "Traceback (most recent call last)"
CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium", shutil.which("chromium-browser")) if p and Path(p).exists()), None)
KINDS = ("pages", "nav", "traceback", "links", "console")

PAGE_JS = """JSON.stringify({
  title: document.title,
  h1: ((document.querySelector('.md-content h1') || {}).textContent || '').replace('¶', '').trim(),
  shown: (() => { const b = document.querySelector('.md-content').cloneNode(true);  // besides the code it quotes
                  b.querySelectorAll('.jp-InputArea, pre code').forEach(e => e.remove()); return b.textContent; })(),
  nav: [...document.querySelectorAll('nav.md-nav--primary a.md-nav__link[href]')]
         .filter(a => !a.getAttribute('href').includes('#')).map(a => ({href: a.href, text: a.textContent.trim()})),
  links: [...document.querySelectorAll('.md-content a[href]')].map(a => a.href)
})"""


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


def browse(urls: list[str], timeout: float = 60) -> dict[str, dict]:
    "Open each URL in one headless Chromium (DevTools protocol): what PAGE_JS sees there, and its `errors`."
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
                    pages = [t for t in await (await http.get(f"http://127.0.0.1:{port}/json/list")).json() if t.get("type") == "page"]
                    if pages: break
                    await asyncio.sleep(0.1)
                async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    cdp = _Cdp(ws)
                    for domain in ("Page", "Runtime", "Log"): await cdp.call(f"{domain}.enable")
                    out = {}
                    for url in urls:
                        await cdp.navigate(url, timeout)
                        r = await cdp.call("Runtime.evaluate", expression=PAGE_JS, returnByValue=True)
                        out[url] = {**json.loads(r["result"]["value"]), "errors": cdp.errors(url)}
                    return out
        finally:  # stop this Chromium and its helper processes (its own process group), nothing else
            proc.terminate()
            try: proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill(); proc.wait(10)
            try: os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError): pass


class _Cdp:
    "The smallest DevTools-protocol client: numbered calls, the events seen since the last navigation."

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
        await asyncio.sleep(0.2)  # scripts run at load (the theme's, the search worker's) may still report

    def errors(self, url) -> list[str]:
        "JavaScript exceptions, console errors and failed loads from this page's own host, one line each."
        host, out = url.split("/")[2], []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(f"exception: {(d.get('exception') or {}).get('description') or d.get('text')}".splitlines()[0])
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out.append("console.error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                src = p["entry"].get("url") or ""
                if not src or src.split("/")[2:3] == [host]: out.append(f"{p['entry']['source']}: {p['entry']['text']} {src}".strip())
        return out


def audit(folder: Path) -> dict[str, list[str]]:
    "Open every page of the site in `folder` in Chromium; the problems found, by kind (see the module's docstring)."
    # 404.html is left out: its links are absolute, right only where the site is served at its site_url
    pages = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.html") if p.name != "404.html")
    found = {k: [] for k in KINDS}
    with Server(folder) as srv:
        rel = lambda u: u[len(srv.base):]
        seen = browse([srv.base + p for p in pages])
        nav = {}
        for url, info in seen.items():
            if not info["title"] or not info["h1"]: found["pages"].append(f"{rel(url)}: no title or heading")
            if TRACEBACK in info["shown"]: found["traceback"].append(rel(url))
            found["console"] += [f"{rel(url)}: {e}" for e in info["errors"]]
            for a in info["nav"]: nav.setdefault(a["href"], a["text"])
        status = {u: http_status(u) for u in nav}
        for u, text in nav.items():
            if status[u] != 200:
                found["nav"].append(f"{rel(u)}: HTTP {status[u]}")
            elif u in seen and text not in (seen[u]["h1"], seen[u]["title"].split(" - ")[0]):
                found["nav"].append(f"{rel(u)}: link says {text!r}, page is titled {seen[u]['title']!r}")
        inside = {l.split("#")[0] for info in seen.values() for l in info["links"] if l.startswith(srv.base)}
        found["links"] = [rel(u) for u in sorted(inside) if http_status(u) != 200]
    return found


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0] if args else "_docs")
    if CHROMIUM is None:
        print("docs audit SKIPPED: no headless Chromium (`apt-get install -y --no-install-recommends chromium`)", file=sys.stderr)
        return 0
    if not (folder / "index.html").exists(): raise SystemExit(f"{folder}/index.html does not exist: build the site first")
    t0 = time.time()
    found = audit(folder)
    n = len([p for p in folder.rglob("*.html") if p.name != "404.html"])
    for kind in KINDS:
        for p in found[kind]: print(f"{kind}: {p}", file=sys.stderr)
    bad = sum(map(len, found.values()))
    print(f"docs audit: {n} pages opened in Chromium in {time.time() - t0:.0f}s, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
