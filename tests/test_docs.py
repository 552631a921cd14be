"""Documentation that can be read without running anything: the mkdocs site (mkdocs.yml, its hook tools/docs.py)
built and opened in a real headless Chromium (tools/docs_audit.py), and the committed-output checks
(tools/nb_outputs.py) on hand-made notebooks and on nbs/ itself.

The browser part needs Debian's `chromium` (`apt-get install -y --no-install-recommends chromium`); without it
those tests are skipped with a message saying so. Nothing here reaches the network: the pages are served from
127.0.0.1 by a server each audit starts and stops, and Chromium resolves no other host.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import docs  # noqa: E402
import nb_outputs  # noqa: E402
from docs_audit import CHROMIUM, KINDS, TRACEBACK, audit  # noqa: E402

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium: `apt-get install -y --no-install-recommends chromium` to run the browser checks")


def mkdocs_build(project: Path, *args) -> subprocess.CompletedProcess:
    "`mkdocs build --strict` in `project` (its own mkdocs.yml), as `bash tools/run.sh docs` runs it."
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", *args], cwd=project, capture_output=True,
                          text=True, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=900)


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


MINILIB = '''"""A tiny library for the docs tests."""
__all__ = ['add']

def add(a:int, # the first number
        b:int=1): # the second
    "Add `b` to `a`."
    return a + b  # EXPORTED_BODY
'''


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """A tiny nbdev project built with the repository's mkdocs.yml and hook: a library module, three notebooks (one
    with an error output and a console error), a sidebar naming one that does not exist, a README."""
    root = tmp_path_factory.mktemp("mini")
    nbs = root / "nbs"
    (root / "minilib").mkdir()
    (root / "minilib" / "__init__.py").write_text("")
    (root / "minilib" / "core.py").write_text(MINILIB)
    make_nb(nbs / "01_good.ipynb", [
        ("code", "#| default_exp core"),
        ("md", "Some **bold** text and a [link to the other one](02_bad.ipynb#part), and $x^2$."),
        ("code", "#| hide\nSECRET_SETUP = 1"),
        ("code", "#| export\n" + MINILIB.split("\n\n", 1)[1]),
        ("code", "#| exports\nSHOWN_EXPORT = 2"),
        ("code", "#| echo: false\nprint('only the output')", [out_text("only the output\n")]),
        ("code", "#| include: false\nINCLUDED_NOT = 3", [out_text("INCLUDED_NOT\n")]),
        ("code", "#| output: false\nOUTPUT_OFF = 4\nOUTPUT_OFF", [out_result("OUTPUT_OFF_VALUE")]),
        ("code", "x = [1, 2, 3]\nx", [out_result("[1, 2, 3]")]),
        ("code", "plot()", [{"output_type": "display_data", "metadata": {}, "data": {"image/png": PNG_1PX, "text/plain": "<Figure>"}}]),
        ("md", "## A section\n\n| a | b |\n|---|---|\n| 1 | 2 |"),
    ], title="Good notebook")
    make_nb(nbs / "02_bad.ipynb", [("code", "1/0", [out_error()]), ("code", "js()", [{"output_type": "display_data", "metadata": {},
            "data": {"text/html": "<script>console.error('planted error')</script>", "text/plain": "js"}}])], title="Bad notebook")
    make_nb(nbs / "tutorials" / "walk.ipynb", [("md", "Back to [the good one](../01_good.ipynb); [gone](nowhere.html)."),
                                               ("code", f"log = '{TRACEBACK}:'  # quoting one in code is fine")], title="A walk")
    (nbs / "sidebar.yml").write_text(
        "website:\n  sidebar:\n    contents:\n      - index.ipynb\n      - section: Core\n        contents:\n"
        "          - 01_good.ipynb\n          - 02_bad.ipynb\n          - 03_missing.ipynb\n"
        "      - section: Tutorials\n        contents:\n          - tutorials/walk.ipynb\n")
    (root / "settings.ini").write_text("[DEFAULT]\nlib_name = minilib\nlib_path = minilib\nnbs_path = nbs\ndoc_path = _docs\n"
                                       "recursive = True\nbranch = main\ngit_url = https://github.com/o/mini\n")
    (root / "README.md").write_text("<!-- generated -->\n\n# Mini project\n\n> The front page.\n\nSee [the good notebook](nbs/01_good.ipynb) "
                                    "and [the settings](settings.ini).\n")
    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    cfg.update(site_name="Mini", hooks=[str(ROOT / "tools" / "docs.py")], watch=[])
    (root / "mkdocs.yml").write_text(yaml.safe_dump(cfg))
    return root, mkdocs_build(root)


def test_mini_site_build(mini):
    root, res = mini
    out = root / "_docs"
    log = res.stdout + res.stderr
    assert res.returncode == 1 and "Aborted with 1 warnings in strict mode" in log, log[-3000:]
    assert "A reference to '03_missing.ipynb' is included in the 'nav' configuration, which is not found" in log
    assert {p.relative_to(out).as_posix() for p in out.rglob("*.html")} >= {
        "01_good.html", "02_bad.html", "index.html", "tutorials/walk.html", "api/minilib.core.html"}
    good = (out / "01_good.html").read_text()
    text = re.sub(r"<[^>]+>", "", good)
    assert "<title>Good notebook - Mini</title>" in good and "What Good notebook is for." in good  # the frontmatter
    assert "SECRET_SETUP" not in good and "EXPORTED_BODY" not in good and "default_exp" not in good  # hide, export
    assert 'id="add"' in good and "Add <code>b</code> to <code>a</code>." in good and "the first number" in good  # show_doc
    assert "SHOWN_EXPORT" in good                                           # #| exports: the code is shown
    assert "#|" not in text and "print(&#39;only" not in good and "print('only" not in good and "only the output" in good
    assert "INCLUDED_NOT" not in good and "OUTPUT_OFF = 4" in good and "OUTPUT_OFF_VALUE" not in good  # include, output
    assert "<strong>bold</strong>" in good and "<table" in good and "data:image/png;base64," + PNG_1PX[:20] in good
    assert 'href="02_bad.html#part"' in good                                # foo.ipynb -> its page
    assert 'href="../01_good.html"' in (out / "tutorials" / "walk.html").read_text()
    front = (out / "index.html").read_text()
    assert re.search(r"<h1[^>]*>Mini project", front) and 'href="01_good.html"' in front
    assert 'href="https://github.com/o/mini/blob/main/settings.ini"' in front  # another file of the repo: on GitHub
    api = (out / "api" / "minilib.core.html").read_text()
    assert "add" in api and "Add <code>b</code> to <code>a</code>." in api and 'href="../01_good.html"' in api
    nav = re.findall(r'class="md-nav__link[^"]*"[^>]*href="([^"#]+)"|href="([^"#]+)"[^>]*class="md-nav__link', front)
    nav = list(dict.fromkeys(a or b for a, b in nav))
    assert nav == ["index.html", "01_good.html", "02_bad.html", "03_missing.ipynb", "tutorials/walk.html", "api/minilib.core.html"], nav


@needs_chromium
def test_browser_audit_finds_what_is_wrong_with_the_mini_site(mini):
    "The audit used on the real site can fail: a missing nav page, a traceback, a broken link, a console error."
    root, _ = mini
    found = audit(root / "_docs")
    assert found["nav"] == ["03_missing.ipynb: HTTP 404"]
    assert found["traceback"] == ["02_bad.html"]
    assert found["links"] == ["tutorials/nowhere.html"]
    assert len(found["console"]) == 1 and found["console"][0].startswith("02_bad.html: console.error: planted error")
    assert found["pages"] == []


def test_nav_from_the_real_sidebar():
    nav = docs.nav_from_sidebar(ROOT / "nbs" / "sidebar.yml", {"index.md": "Home"})
    sections = [next(iter(e)) for e in nav if isinstance(next(iter(e.values())), list)]
    assert nav[0] == {"Home": "index.md"} and len(sections) >= 3
    pages = [p for e in nav for v in e.values() for p in (v if isinstance(v, list) else [v])]
    assert all(isinstance(p, dict) and next(iter(p.values())).endswith(".ipynb") for p in pages if not isinstance(p, str))


# ---------------------------------------------------------------- the real site

@pytest.fixture(scope="module")
def real_site(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs") / "site"
    res = mkdocs_build(ROOT, "--site-dir", str(out))
    return out, res


@pytest.mark.slow
def test_real_site_builds(real_site):
    out, res = real_site
    assert res.returncode == 0, res.stderr[-5000:]
    from nbdev.doclinks import nbglob
    for p in nbglob(ROOT / "nbs", as_path=True):
        if p.name != "index.ipynb": assert (out / p.relative_to(ROOT / "nbs").with_suffix(".html")).exists(), p
    assert (out / "index.html").exists() and len(list((out / "api").glob("*.html"))) > 10
    api = (out / "api" / "composer_replication.opsd.html").read_text()
    assert "generalized_jsd_loss" in api and "linear_generalized_jsd_loss" in api
    opsd = (out / "01_opsd.html").read_text()
    assert 'id="generalized_jsd_loss"' in opsd and "api/composer_replication.opsd.html" in opsd  # inline show_doc
    assert re.search(r'href="https://github.com/[^"]+/blob/main/composer_replication/opsd.py#L\d+"[^>]*>source</a>', opsd)
    # size: a budget per page, so that the site may grow with its notebooks but a page of untrimmed outputs fails
    # (2026-12-07: 166 pages, 30.0 MB in all with the theme's assets and the search index; the largest page 0.5 MB)
    pages = [f.stat().st_size for f in out.rglob("*.html")]
    assert max(pages) < 2e6, max(pages)
    assert sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) < 250e3 * len(pages), (sum(pages), len(pages))


@pytest.mark.slow
@needs_chromium
def test_real_site_in_a_browser(real_site):
    "Every page loads with a title; every nav link resolves to a page of that title; no traceback, broken link, JS error."
    out, res = real_site
    assert res.returncode == 0
    assert audit(out) == {k: [] for k in KINDS}


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
