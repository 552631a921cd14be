"""Render the documentation site without Quarto: the notebooks' committed outputs, the README, an API page per module.

    python tools/docs.py                  # writes _docs/ (what `bash tools/run.sh docs` runs)
    python tools/docs.py --out /tmp/site  # somewhere else
    python tools/docs.py --no-api         # skip the API pages and the inline `show_doc`s (imports nothing)

Nothing is executed: notebook pages show the outputs committed in `nbs/*.ipynb` (see tools/nb_outputs.py). The
sidebar comes from `nbs/sidebar.yml` (sections and links, as Quarto reads it) plus an "API reference" section;
`README.md` is the front page (it is written from `nbs/index.ipynb`, which therefore has no page of its own).
Cells are processed the way nbdev's docs pipeline does (`#| hide`, `#| export` removed, `show_doc` of each exported
name in their place, `echo`/`output`/`include` honoured, directives stripped); markdown, code highlighting and
outputs are rendered by nbconvert's HTMLExporter (basic template), all offline. Relative links between notebooks
(`foo.ipynb` -> `foo.html`) and to the README are rewritten; links to other files of the repository point at the
repository on GitHub; local images are copied. `_quarto.yml` is untouched: `nbdev_docs` still works where Quarto is.

Exit status: 1 if a sidebar entry names a notebook that does not exist (the site is still written), else 0.
"""
from __future__ import annotations

import argparse
import ast
import html
import importlib
import inspect
import os
import posixpath
import re
import shutil
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = ".composer-docs"  # written into the output folder; a non-empty folder without it is never wiped
MATHJAX = "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"  # optional: offline, TeX shows as source

CSS = """
:root { --side: 17rem; --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg2: #f6f8fa; --link: #0969da; }
* { box-sizing: border-box; }
body { margin: 0; font: 16px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); }
a { color: var(--link); text-decoration: none; } a:hover { text-decoration: underline; }
nav.sidebar { position: fixed; top: 0; bottom: 0; left: 0; width: var(--side); overflow-y: auto; overflow-x: hidden; padding: 1rem;
  background: var(--bg2); border-right: 1px solid var(--line); font-size: 14px; }
nav.sidebar .site-title { display: block; font-weight: 600; font-size: 17px; margin-bottom: .8rem; color: var(--fg); }
nav.sidebar .section { margin: .9rem 0 .25rem; font-weight: 600; color: var(--muted); text-transform: uppercase;
  font-size: 12px; letter-spacing: .04em; }
nav.sidebar ul { list-style: none; margin: 0; padding: 0 0 0 .4rem; }
nav.sidebar li { margin: .15rem 0; overflow-wrap: anywhere; }
nav.sidebar a[aria-current=page] { font-weight: 600; color: var(--fg); }
main { margin-left: var(--side); padding: 1.5rem 2.5rem 4rem; max-width: calc(var(--side) + 62rem); }
header.page h1 { margin: 0 0 .3rem; } header.page p.description { color: var(--muted); font-size: 18px; margin-top: 0; }
header.page .api-link { font-size: 14px; }
pre, code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13.5px; }
code { background: var(--bg2); padding: .1em .3em; border-radius: 4px; } pre code { background: none; padding: 0; }
h1 code, h2 code, h3 code, h4 code { font-size: .9em; }
pre { background: var(--bg2); padding: .7rem .9rem; border-radius: 6px; overflow-x: auto; margin: .4rem 0; }
.jp-Cell, .cell { margin: .8rem 0; }
.input_area .highlight pre, .jp-InputArea .highlight pre { border-left: 3px solid #8c959f; }
.output_area pre, .jp-OutputArea pre, .output_subarea pre { background: #fff; border: 1px solid var(--line); }
.output_stderr pre, .jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"] pre { background: #fff8f0; }
.output_png img, .output_area img, .jp-RenderedImage img { max-width: 100%; height: auto; }
.prompt, .jp-InputPrompt, .jp-OutputPrompt { display: none; }
table { border-collapse: collapse; margin: .6rem 0; font-size: 14px; }
th, td { border: 1px solid var(--line); padding: .3rem .6rem; text-align: left; vertical-align: top; }
th { background: var(--bg2); }
.api-doc { border: 1px solid var(--line); border-radius: 8px; padding: .2rem 1rem .6rem; margin: 1rem 0;
  box-shadow: 0 1px 2px rgba(0,0,0,.05); }
.api-doc hr { display: none; } .api-doc h3 { margin: .6rem 0 .4rem; font-family: ui-monospace, monospace; }
.api-doc .source-link { float: right; font-size: 13px; margin-top: .7rem; }
.api-toc { columns: 2; } .api-note { color: var(--muted); }
img { max-width: 100%; }
.anchor-link { visibility: hidden; margin-left: .3rem; } h1:hover .anchor-link, h2:hover .anchor-link,
h3:hover .anchor-link, h4:hover .anchor-link { visibility: visible; }
.ansi-black-fg { color: #3e424d; } .ansi-red-fg { color: #e75c58; } .ansi-green-fg { color: #00a250; }
.ansi-yellow-fg { color: #ddb62b; } .ansi-blue-fg { color: #208ffb; } .ansi-magenta-fg { color: #d160c4; }
.ansi-cyan-fg { color: #60c6c8; } .ansi-bold { font-weight: bold; }
@media (max-width: 900px) { nav.sidebar { position: static; width: auto; border-right: 0; }
  main { margin-left: 0; padding: 1rem; } }
"""


def _setup_imports():
    "Make the repository importable (the package, nbdev's config) the way nbdev's tools see it."
    if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ---------------------------------------------------------------- sources and the sidebar

def find_notebooks(nbs: Path) -> list[Path]:
    "Every notebook under `nbs` that nbdev would process (folders and files starting with `_` or `.` skipped)."
    out = []
    for p in sorted(nbs.rglob("*.ipynb")):
        rel = p.relative_to(nbs)
        if any(part.startswith(("_", ".")) for part in rel.parts): continue
        out.append(p)
    return out


def read_sidebar(path: Path) -> list:
    """The sidebar as a list of `("link", href, text|None)` and `("section", title, [items])`, from a Quarto
    `sidebar.yml` (`website: sidebar: contents:`, or `website: sidebar: [{contents: ...}]`)."""
    import yaml
    if not path.exists(): return []
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    side = (data.get("website") or {}).get("sidebar") or {}
    if isinstance(side, list): side = side[0] if side else {}
    contents = side.get("contents") if isinstance(side, dict) else side

    def conv(items):
        res = []
        for it in items or []:
            if isinstance(it, str):
                res.append(("link", it, None))
            elif isinstance(it, dict) and "section" in it:
                res.append(("section", str(it["section"]), conv(it.get("contents"))))
            elif isinstance(it, dict) and ("href" in it or "file" in it):
                res.append(("link", it.get("href") or it.get("file"), it.get("text")))
            elif isinstance(it, dict) and "contents" in it:  # an anonymous group
                res.extend(conv(it["contents"]))
        return res

    return conv(contents if isinstance(contents, list) else [])


def sidebar_links(items) -> list[str]:
    "Every href in a sidebar from `read_sidebar`, in order."
    out = []
    for kind, a, b in items:
        if kind == "link": out.append(a)
        else: out.extend(sidebar_links(b))
    return out


# ---------------------------------------------------------------- show_doc

_re_source = re.compile(r"\[source\]\(([^)\s]+)\)\{[^}]*\}")


def _source_url(obj, git_url: str, branch: str) -> str | None:
    "A GitHub link to the line that defines `obj`, or None."
    try:
        obj = inspect.unwrap(obj)
        fn = Path(inspect.getsourcefile(obj)).resolve()
        line = inspect.getsourcelines(obj)[1]
        rel = fn.relative_to(ROOT).as_posix()
    except Exception:
        return None
    return f"{git_url}/blob/{branch}/{rel}#L{line}"


def _plain(title: str) -> str:
    "A title as plain text (sidebar links, the browser tab): markdown code ticks dropped."
    return title.replace("`", "")


def _getattr(obj, name: str):
    "`getattr(obj, name, None)`, also None when a lazy attribute's import fails (a package `__getattr__`)."
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return getattr(obj, name, None)
    except Exception:  # noqa: BLE001
        return None


def _anchor(name: str) -> str:
    "The id of a name's show_doc box (and its link target)."
    return re.sub(r"[^\w.-]", "-", name.lower())


class ApiDocs:
    "show_doc markdown for the package's names, rendered to HTML once and reused by notebook and API pages."

    def __init__(self, lib: str, git_url: str, branch: str, md2html, lib_path: Path):
        self.lib, self.git_url, self.branch, self.md2html, self.lib_path = lib, git_url, branch, md2html, lib_path
        self.mods, self.errors, self._cache = {}, {}, {}

    def module(self, name: str):
        "The imported module, or None (the failure is remembered in `errors`, one line)."
        if name not in self.mods:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    self.mods[name] = importlib.import_module(name)
            except BaseException as e:  # noqa: BLE001 - a module that fails to import gets a note, not a crash
                self.mods[name] = None
                self.errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return self.mods[name]

    def resolve(self, modname: str, dotted: str):
        "The object `dotted` (e.g. `Cls.method`) in module `modname`, or None."
        obj = self.module(modname)
        for part in dotted.split("."):
            if obj is None: return None
            obj = _getattr(obj, part)
        return obj

    def markdown(self, obj, name: str) -> str:
        "nbdev's show_doc markdown for `obj`; plain objects (constants) get their type and a short repr."
        if not (inspect.isclass(obj) or inspect.isroutine(obj) or callable(obj)):
            r = repr(obj)
            if len(r) > 300: r = r[:300] + " …"
            return f"### {name}\n\n```python\n{name}: {type(obj).__name__} = {r}\n```\n"
        from nbdev.showdoc import show_doc
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            md = show_doc(obj, name=name)._repr_markdown_()
        url = _source_url(obj, self.git_url, self.branch)
        link = f'<a class="source-link" href="{html.escape(url)}">source</a>' if url else ""
        return _re_source.sub(lambda m: link, md)

    def html(self, modname: str, dotted: str) -> str:
        "The rendered show_doc box for `modname.dotted`, or '' if it cannot be found."
        key = (modname, dotted)
        if key not in self._cache:
            obj = self.resolve(modname, dotted)
            static = _static_doc(self.py_file(modname), dotted) if obj is None and modname in self.errors else ""
            if obj is None and not static:
                self._cache[key] = ""
            elif obj is None:  # the module does not import here: signature and docstring read from its source
                self._cache[key] = f'<div class="api-doc" id="{_anchor(dotted)}">{self.md2html(static)}</div>'
            else:
                try:
                    body = self.md2html(self.markdown(obj, dotted))
                except Exception as e:  # noqa: BLE001
                    body = f"<h3>{html.escape(dotted)}</h3><p class='api-note'>(no documentation: {html.escape(type(e).__name__)})</p>"
                anchor = _anchor(dotted)
                self._cache[key] = f'<div class="api-doc" id="{anchor}">{body}</div>'
        return self._cache[key]

    def py_file(self, modname: str) -> Path | None:
        "The module's source file, found without importing it."
        base = self.lib_path.parent / modname.replace(".", "/")
        return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.exists()), None)

    def public_names(self, modname: str, py_file: Path | None) -> list[str]:
        "The module's `__all__` (from the import, else read from its source), plus each class's own public methods."
        mod = self.module(modname)
        names = list(getattr(mod, "__all__", []) or []) if mod is not None else _static_all(py_file)
        out = []
        for n in names:
            out.append(n)
            obj = _getattr(mod, n) if mod is not None else None
            if inspect.isclass(obj) and getattr(obj, "__module__", None) == modname:
                for k, v in vars(obj).items():
                    if k.startswith("_") or not (inspect.isfunction(v) or isinstance(v, (classmethod, staticmethod, property))): continue
                    out.append(f"{n}.{k}")
        return out


def _static_all(py_file: Path | None) -> list[str]:
    "`__all__` read from a module's source without importing it."
    if not py_file or not py_file.exists(): return []
    try: tree = ast.parse(py_file.read_text(encoding="utf-8"))
    except (SyntaxError, ValueError): return []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            try: return list(ast.literal_eval(node.value))
            except ValueError: return []
    return []


def _static_doc(py_file: Path | None, name: str) -> str:
    "A signature and docstring read from the source, for modules that cannot be imported here."
    if not py_file or not py_file.exists(): return ""
    try: tree = ast.parse(py_file.read_text(encoding="utf-8"))
    except (SyntaxError, ValueError): return ""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            sig = f"class {name}" if isinstance(node, ast.ClassDef) else f"def {name}({ast.unparse(node.args)})"
            doc = ast.get_docstring(node) or ""
            return f"### {name}\n\n```python\n{sig}\n```\n\n{('*' + doc.splitlines()[0] + '*') if doc else ''}\n"
    return ""


# ---------------------------------------------------------------- notebook processing

def _exported_names(source: str) -> list[str]:
    "Names nbdev would `show_doc` after an exported cell: public top-level defs and classes (`Cls.f` when patched)."
    from nbdev.showdoc import showdoc_nm
    try: tree = ast.parse(source)
    except SyntaxError: return []
    return [showdoc_nm(o) for o in tree.body if isinstance(o, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and (not o.name.startswith("_") or o.name.startswith("__"))]


_re_directive_line = re.compile(r"^\s*#\|.*$\n?", re.MULTILINE)


def process_notebook(path: Path, api: ApiDocs | None, lib: str):
    "The notebook as nbdev's docs pipeline leaves it (nothing executed), its frontmatter, and its module name."
    from execnb.nbio import mk_cell, read_nb
    from nbdev.frontmatter import FrontmatterProc
    from nbdev.process import NBProcessor
    from nbdev.processors import (ai_magics, clean_magics, filter_stream_, hide_, hide_line, populate_language,
                                  rm_export, rm_header_dash, strip_ansi, strip_hidden_metadata)

    nb = read_nb(path)
    module = None
    for c in nb.cells:
        m = re.search(r"^\s*#\|\s*default_exp\s+(\S+)", c.source, re.MULTILINE) if c.cell_type == "code" else None
        if m: module = re.sub(r"\.__init__$", "", f"{lib}.{m.group(1)}"); break

    def inline_show_docs(cell):
        "After each exported cell, the show_doc of the names it defines (what nbdev's add_show_docs + exec do)."
        if api is None or module is None or cell.cell_type != "code": return
        d = cell.directives_ or {}
        if not ({"export", "exports", "exec_doc"} & d.keys()) or "hide" in d or d.get("include:") == ["false"]: return
        boxes = [api.html(module, n) for n in _exported_names(cell.source)]
        boxes = [b for b in boxes if b]
        if boxes:
            extra = mk_cell("\n".join(boxes), "raw")
            extra.metadata["raw_mimetype"] = "text/html"
            cell.docs_after_ = extra

    def quarto_options(cell):
        "`#| echo: false` hides the code, `output: false` the outputs, `include: false` both; then strip `#|` lines."
        if cell.cell_type != "code": return
        d = cell.directives_ or {}
        val = lambda k: (d.get(k) or [""])[0].lower()
        if val("include:") == "false": del cell["source"]; return
        if val("output:") == "false": cell["outputs"] = []
        for o in cell.get("outputs") or []:  # committed show_doc output: Quarto's `{target=...}` link attributes
            md = (o.get("data") or {}).get("text/markdown")
            if md: o["data"]["text/markdown"] = _re_source.sub(lambda m: f'<a class="source-link" href="{m.group(1)}">source</a>', "".join(md))
        if re.match(r"\s*show_doc\(", _re_directive_line.sub("", cell.source)): d = {**d, "echo:": ["false"]}  # as nbdev does
        cell.source = _re_directive_line.sub("", cell.source).strip("\n")
        if val("echo:") == "false" or not cell.source.strip():
            cell.metadata.setdefault("transient", {})["remove_source"] = True
            if not cell.get("outputs"): del cell["source"]

    procs = [FrontmatterProc, populate_language, inline_show_docs, strip_ansi, hide_line, filter_stream_,
             rm_header_dash, rm_export, ai_magics, clean_magics, hide_, quarto_options, strip_hidden_metadata]
    proc = NBProcessor(nb=nb, procs=procs)
    # rm_export deletes exported cells, so collect the show_doc boxes first and splice them in after processing.
    cells_before = list(nb.cells)
    proc.process()
    kept = {id(c) for c in nb.cells}
    cells = []
    for c in cells_before:
        if id(c) in kept: cells.append(c)
        if getattr(c, "docs_after_", None) is not None: cells.append(c.docs_after_)
    fm = dict(getattr(nb, "frontmatter_", {}) or {})
    nb.cells = [c for c in cells if not (c.cell_type == "raw" and c.source.lstrip().startswith("---"))]
    return nb, fm, module


def _to_nbformat(nb):
    "execnb's AttrDict notebook as an nbformat node (private `_`-suffixed keys dropped)."
    import nbformat
    from execnb.nbio import nb2str
    for c in nb.cells:
        for k in [k for k in c if k.endswith("_")]: del c[k]
        c.pop("idx_", None)
    return nbformat.reads(nb2str(nb), as_version=4)


# ---------------------------------------------------------------- the site

def _exporter():
    """nbconvert's HTMLExporter (basic template: the cells without a page around them), minus two costs that buy
    nothing for our own notebooks: bleach re-sanitizing every highlighted cell, and a BeautifulSoup pass that only
    adds alt texts and tabindex attributes (together ~85% of the build time)."""
    from nbconvert import HTMLExporter
    from nbconvert.exporters.templateexporter import TemplateExporter
    from nbconvert.filters.highlight import Highlight2HTML
    from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

    class _Exporter(HTMLExporter):
        def from_notebook_node(self, nb, resources=None, **kw):
            try:
                self.register_filter("highlight_code", self.filters.get("highlight_code", Highlight2HTML(pygments_lexer="ipython3", parent=self)))
                resources = self._init_resources(resources)
                self.register_filter("filter_data_type", WidgetsDataTypeFilter(notebook_metadata=self._nb_metadata, parent=self, resources=resources))
            except Exception:  # another nbconvert version: its own (slower) path
                return super().from_notebook_node(nb, resources, **kw)
            return TemplateExporter.from_notebook_node(self, nb, resources, **kw)

    return _Exporter(template_name="basic", exclude_input_prompt=True, exclude_output_prompt=True,
                     filters={"clean_html": lambda s: s})


class Site:
    "Everything needed to write one site: sources, their pages, the sidebar, the renderer."

    def __init__(self, out: Path, nbs: Path, readme: Path | None, sidebar: Path, api: bool, lib: str,
                 title: str, git_url: str, branch: str, lib_path: Path):
        from nbconvert.filters.markdown_mistune import markdown2html_mistune
        self.out, self.nbs, self.title = out, nbs, title
        self.readme = readme if readme and readme.is_file() else None
        self.git_url, self.branch, self.lib, self.lib_path = git_url.rstrip("/"), branch, lib, lib_path
        self.md2html = markdown2html_mistune
        self.exporter = _exporter()
        self.api = ApiDocs(lib, self.git_url, branch, markdown2html_mistune, lib_path.absolute()) if api else None
        self.sidebar = read_sidebar(sidebar)
        self.notebooks = find_notebooks(nbs)
        self.pages: dict[Path, str] = {}  # source file (resolved) -> page path relative to out, posix
        if self.readme:  # the front page; nbs/index.ipynb (the README's source) links to it
            self.pages[readme.resolve()] = self.pages[(nbs / "index.ipynb").resolve()] = "index.html"
        for p in self.notebooks:
            rel = p.relative_to(nbs).with_suffix(".html").as_posix()
            self.pages[p.resolve()] = rel  # (nbs/index.ipynb is index.html either way: the README, or itself)
        self.titles: dict[str, str] = {}  # page -> title
        self.problems: list[str] = []
        self.repo_root = self.readme.parent.resolve() if self.readme else ROOT  # the README sits at the repository's root
        self.full_sidebar = list(self.sidebar)  # + the API section; items the build adds use a `__page__:` href

    # -- links
    def _rewrite_links(self, body: str, src_dir: Path, page: str) -> str:
        "Relative links resolved from the source's folder: notebooks/README -> their pages, other repo files -> GitHub."
        page_dir = posixpath.dirname(page)

        def fix(m):
            attr, q, url = m.group(1), m.group(2), html.unescape(m.group(3))
            if not url or url.startswith(("#", "/", "data:", "mailto:", "javascript:")) or re.match(r"^[a-zA-Z][\w+.-]*:", url):
                return m.group(0)
            path, _, frag = url.partition("#")
            target = (src_dir / path).resolve() if path else None
            new = None
            if target is not None and target in self.pages:
                new = posixpath.relpath(self.pages[target], page_dir or ".")
            elif path.endswith(".ipynb"):
                new = path[:-6] + ".html"  # a notebook that is not there: keep it visibly broken for the link check
            elif target is not None and target.exists() and attr == "src" and target.is_file():
                try:
                    rel = target.relative_to(self.nbs.resolve())
                except ValueError:
                    rel = Path("_assets") / target.name
                dest = self.out / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(target, dest)
                new = posixpath.relpath(rel.as_posix(), page_dir or ".")
            elif target is not None and target.exists():
                try:
                    rel = target.relative_to(self.repo_root).as_posix()
                    new = f"{self.git_url}/{'tree' if target.is_dir() else 'blob'}/{self.branch}/{rel}"
                except ValueError:
                    new = None
            if new is None: return m.group(0)
            if frag: new += "#" + frag
            return f"{attr}={q}{html.escape(new, quote=True)}{q}"

        return re.sub(r"""\b(href|src)=(["'])(.*?)\2""", fix, body)

    # -- page shell
    def _sidebar_html(self, page: str) -> str:
        page_dir = posixpath.dirname(page) or "."

        def link(href, text):
            target = self._sidebar_page(href)
            if target is None:
                target = href[:-6] + ".html" if href.endswith(".ipynb") else href
                text = text or Path(href).stem
            text = _plain(text or self.titles.get(target) or Path(href).stem)
            cur = ' aria-current="page"' if target == page else ""
            return f'<li><a href="{html.escape(posixpath.relpath(target, page_dir))}"{cur}>{html.escape(text)}</a></li>'

        def items(its):
            res = []
            for kind, a, b in its:
                if kind == "link": res.append(link(a, b))
                else: res.append(f'<li><div class="section">{html.escape(a)}</div><ul>{"".join(items(b))}</ul></li>')
            return res

        home = posixpath.relpath("index.html", page_dir)
        return (f'<nav class="sidebar"><a class="site-title" href="{home}">{html.escape(self.title)}</a>'
                f'<ul>{"".join(items(self.full_sidebar))}</ul></nav>')

    def _inline(self, text: str) -> str:
        "One line of markdown (a title, a description) as inline HTML."
        out = self.md2html(text).strip()
        return out[3:-4].strip() if out.startswith("<p>") and out.endswith("</p>") else out

    def _shell(self, page: str, title: str, description: str, body: str, extra_head: str = "") -> str:
        page_dir = posixpath.dirname(page) or "."
        css = posixpath.relpath("site.css", page_dir)
        desc = f'<p class="description">{self._inline(description)}</p>' if description else ""
        full_title = _plain(title) if _plain(title) == self.title else f"{_plain(title)} – {self.title}"
        h1 = self._inline(title)
        return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(full_title)}</title>
<link rel="stylesheet" href="{css}">
<script>window.MathJax = {{ tex: {{ inlineMath: [['$','$'], ['\\\\(','\\\\)']], processEscapes: true }} }};</script>
<script async src="{MATHJAX}"></script>
{extra_head}</head>
<body>
{self._sidebar_html(page)}
<main>
<header class="page"><h1>{h1}</h1>{desc}</header>
{body}
</main>
</body>
</html>
"""

    # -- building
    def build(self) -> dict:
        t0 = time.time()
        self._prepare_out()
        rendered = {}  # page -> (title, description, body html, extra)
        modules = {}   # module -> notebook page
        # 1. notebooks (collect titles first so the sidebar can show them)
        for p in self.notebooks:
            page = self.pages[p.resolve()]
            if page == "index.html" and self.readme: continue
            try:
                nb, fm, module = process_notebook(p, self.api, self.lib)
                node = _to_nbformat(nb)
                body, _ = self.exporter.from_notebook_node(node, resources={"metadata": {"path": str(p.parent)}})
            except Exception as e:  # noqa: BLE001 - one unreadable notebook must not cost the whole site
                self.problems.append(f"could not render {p.relative_to(self.nbs)}: {type(e).__name__}: {e}")
                continue
            body = self._rewrite_links(body, p.parent, page)
            title = str(fm.get("title") or p.stem)
            self.titles[page] = title
            if module: modules[module] = page
            rendered[page] = (title, str(fm.get("description") or ""), body, module)
        # 2. README as the front page
        if self.readme:
            text = self.readme.read_text(encoding="utf-8")
            text = re.sub(r"\A\s*<!--.*?-->\s*", "", text, flags=re.S)
            m = re.match(r"\s*#\s+(.+)\n", text)
            title = m.group(1).strip() if m else self.title
            if m: text = text[m.end():]
            body = self._rewrite_links(self.md2html(text), self.readme.parent, "index.html")
            self.titles["index.html"] = title
            rendered["index.html"] = (title, "", body, None)
        # 3. API pages
        api_pages = []
        if self.api is not None:
            for module in sorted(modules):
                page = f"api/{module}.html"
                self.titles[page] = module
                api_pages.append(page)
                rendered[page] = (module, "", self._api_body(module, modules[module], page), None)
        self.full_sidebar = list(self.sidebar)
        if api_pages:
            self.full_sidebar.append(("section", "API reference", [("link", f"__page__:{p}", self.titles[p]) for p in api_pages]))
        # 4. write
        for page, (title, desc, body, module) in rendered.items():
            if module and self.api is not None:
                api_href = posixpath.relpath(f"api/{module}.html", posixpath.dirname(page) or ".")
                desc_extra = f'<p class="api-link">API: <a href="{api_href}"><code>{module}</code></a></p>'
                body = desc_extra + body
            dest = self.out / page
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(self._shell(page, title, desc, body), encoding="utf-8")
        self._check_sidebar()
        secs = time.time() - t0
        size = sum(f.stat().st_size for f in self.out.rglob("*") if f.is_file())
        return {"pages": len(rendered), "notebooks": len([p for p in rendered if not p.startswith("api/") and p != "index.html"]),
                "api_pages": len(api_pages), "seconds": secs, "bytes": size, "problems": self.problems,
                "import_errors": dict(self.api.errors) if self.api else {}}

    def _api_body(self, module: str, nb_page: str, page: str) -> str:
        py = self.api.py_file(module)
        names = self.api.public_names(module, py)
        nb_href = posixpath.relpath(nb_page, "api")
        parts = [f'<p>The public names of <code>{module}</code>, written from <a href="{nb_href}">its notebook</a> '
                 f"(where each comes with its lesson).</p>"]
        if module in self.api.errors:
            parts.append(f"<p class='api-note'>Could not import the module here ({html.escape(self.api.errors[module])}): "
                         "signatures and first docstring lines are read from the source.</p>")
        if not names:
            parts.append("<p class='api-note'>No public names.</p>")
            return "\n".join(parts)
        toc = "".join(f'<li><a href="#{_anchor(n)}"><code>{html.escape(n)}</code></a></li>' for n in names if "." not in n)
        parts.append(f'<ul class="api-toc">{toc}</ul>')
        for n in names:
            box = self.api.html(module, n)
            if not box and "." not in n:  # neither imported nor a def/class in the source (a constant, a re-export)
                box = f'<div class="api-doc" id="{_anchor(n)}">{self.md2html(f"### {n}")}</div>'
            parts.append(box)
        return self._rewrite_links("\n".join(parts), self.lib_path, page)

    def _sidebar_page(self, href: str) -> str | None:
        if href.startswith("__page__:"): return href.split(":", 1)[1]
        return self.pages.get((self.nbs / href).resolve())

    def _check_sidebar(self):
        listed = set()
        for href in sidebar_links(self.sidebar):
            page = self._sidebar_page(href)
            if page is None or not (self.out / page).exists():
                self.problems.append(f"sidebar entry {href!r} names no notebook in {self.nbs}")
            else:
                listed.add(page)
        for p in self.notebooks:
            page = self.pages[p.resolve()]
            if page not in listed and page != "index.html":
                print(f"note: {p.relative_to(self.nbs)} is not in the sidebar (its page is {page})")

    def _prepare_out(self):
        out = self.out
        if out.exists():
            if any(out.iterdir()) and not (out / MARKER).exists():
                raise SystemExit(f"{out} is not empty and was not written by tools/docs.py: refusing to wipe it")
            shutil.rmtree(out)
        out.mkdir(parents=True)
        (out / MARKER).write_text("written by tools/docs.py; the whole folder is replaced on each build\n")
        (out / ".nojekyll").write_text("")
        from pygments.formatters import HtmlFormatter
        (out / "site.css").write_text(CSS + HtmlFormatter(style="default").get_style_defs(".highlight"), encoding="utf-8")



def build_site(out=None, nbs=None, readme=None, sidebar=None, api=True) -> dict:
    "Write the site; returns figures and the problems found (sidebar entries naming no notebook)."
    _setup_imports()
    from nbdev.config import get_config
    cfg = get_config(path=ROOT)
    nbs = Path(nbs) if nbs else Path(cfg.nbs_path)
    out = Path(out) if out else Path(cfg.doc_path)
    readme = None if readme == "" else Path(readme) if readme is not None else ROOT / "README.md"
    sidebar = Path(sidebar) if sidebar else nbs / "sidebar.yml"
    site = Site(out.absolute(), nbs.absolute(), readme.absolute() if readme else None, sidebar, api,
                cfg.lib_name, cfg.get("title", cfg.lib_name), cfg.git_url, cfg.get("branch", "main"), Path(cfg.lib_path))
    return site.build()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="output folder (default: doc_path in settings.ini, _docs)")
    ap.add_argument("--nbs", help="notebook folder (default: nbs_path, nbs)")
    ap.add_argument("--readme", help="front page markdown (default: README.md; '' for none)")
    ap.add_argument("--sidebar", help="Quarto sidebar file (default: NBS/sidebar.yml)")
    ap.add_argument("--no-api", action="store_true", help="no API pages and no inline show_doc (imports nothing)")
    a = ap.parse_args(argv)
    res = build_site(a.out, a.nbs, a.readme, a.sidebar, api=not a.no_api)
    for mod, err in res["import_errors"].items():
        print(f"note: could not import {mod} ({err}); its API page is read from the source")
    for p in res["problems"]:
        print(f"ERROR: {p}", file=sys.stderr)
    out = a.out or "_docs"
    print(f"wrote {res['pages']} pages ({res['notebooks']} notebooks, {res['api_pages']} API pages, front page) "
          f"to {out}/ in {res['seconds']:.1f}s, {res['bytes'] / 1e6:.1f} MB")
    return 1 if res["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
