"""The package's layout rules, checked: run by `.ci/run`, or `python tools/layout.py` from the project's root.

    no import cycle         between package modules (a package `__init__` importing its own children aside)
    no re-export shim       a module-level `__getattr__` only in a package `__init__` (lazy top-level names, optional stacks)
    no private import       an `_underscore` name imported from another package module; no entry point naming one
    the map is the layout   a notebook imports only modules whose notebooks sort before its own (lesson cells included;
                            a package's notebook may import its own children); no two notebooks share a number prefix
                            (`15f`); a package's notebook sorts before its children's; every notebook is in nbs/sidebar.yml

Each rule prints PASS or FAIL with what broke it; the exit status is the number of rules broken.
"""
from __future__ import annotations

import ast
import configparser
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "composer_replication"


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    "Dotted module name -> file, for every module of the package (`_modidx` aside)."
    mods = {}
    for p in sorted((root/PKG).rglob("*.py")):
        if p.name == "_modidx.py": continue
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__": parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def imported(mod: str, is_init: bool, tree: ast.AST, mods: dict) -> list[tuple[str, str | None]]:
    "(module, name) pairs that `tree` imports from the package, anywhere in it (function bodies too)."
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_init else mod.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                tgt = ".".join(base + ([node.module] if node.module else []))
            else: tgt = node.module or ""
            if not tgt.startswith(PKG): continue
            for a in node.names:
                sub = f"{tgt}.{a.name}"
                out.append((sub, None) if sub in mods else (tgt, a.name))
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.startswith(PKG)]
    return out


def cycles(edges: dict[str, set]) -> list[list[str]]:
    "Strongly connected components of more than one module (Tarjan)."
    idx, low, stack, on, found = {}, {}, [], set(), []
    def visit(v):
        idx[v] = low[v] = len(idx); stack.append(v); on.add(v)
        for w in edges.get(v, ()):
            if w not in idx: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: found.append(sorted(comp))
    sys.setrecursionlimit(10_000)
    for v in list(edges): 
        if v not in idx: visit(v)
    return found


def notebook_modules(root: Path = ROOT) -> dict[str, str]:
    "Module -> the notebook that exports it (`#| default_exp`)."
    out = {}
    for nb in sorted((root/"nbs").glob("*.ipynb")):
        for c in json.loads(nb.read_text())["cells"]:
            m = re.search(r"^#\|\s*default_exp\s+(\S+)", "".join(c["source"]), re.M)
            if c["cell_type"] == "code" and m: out[f"{PKG}.{m.group(1)}".removesuffix(".__init__")] = nb.name; break
    return out


def notebook_imports(nb: Path) -> set[str]:
    "Package modules a notebook's code cells import (a cell that does not parse, e.g. `!` or `%` lines, is read line by line)."
    found = set()
    for c in json.loads(nb.read_text())["cells"]:
        if c["cell_type"] != "code": continue
        src = "".join(c["source"])
        for line in src.splitlines():
            m = re.match(r"\s*(?:from\s+(composer_replication[\w.]*)\s+import\s+([\w, ()]+)|import\s+(composer_replication[\w.]*))", line)
            if not m: continue
            if m.group(3): found.add(m.group(3)); continue
            found.add(m.group(1))
            found |= {f"{m.group(1)}.{n.strip()}" for n in m.group(2).strip("() ").split(",") if n.strip()}
    return found


def check(root: Path = ROOT) -> list[tuple[str, list]]:
    "Each rule's name and what breaks it (an empty list: it holds)."
    mods = package_modules(root)
    edges, private, shims = {}, [], []
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        is_init = p.name == "__init__.py"
        for dst, name in imported(m, is_init, tree, mods):
            if dst not in mods or dst == m: continue
            if not (is_init and dst.startswith(m + ".")): edges.setdefault(m, set()).add(dst)
            if name and name.startswith("_") and not name.startswith("__"): private.append(f"{m} imports {dst}.{name}")
        if not is_init and any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body): shims.append(m)
    ini = configparser.ConfigParser(); ini.read(root/"settings.ini")
    for key, val in ini["DEFAULT"].items():
        if "entry_points" not in key and "console_scripts" not in key: continue
        for obj in re.findall(r"[\w.]+:([\w.]+)", val):
            if any(part.startswith("_") for part in obj.split(".")): private.append(f"settings.ini {key} names {obj}")
    owner = notebook_modules(root)
    exports = {nb: m for m, nb in owner.items()}
    order = []
    for nb in sorted((root/"nbs").glob("*.ipynb")):
        own = exports.get(nb.name)
        package = own in mods and mods[own].name == "__init__.py"
        for mod in sorted(notebook_imports(nb)):
            later = owner.get(mod)
            if package and mod.startswith(own + "."): continue   # a package's notebook shows its own children
            if later and later > nb.name: order.append(f"{nb.name} imports {mod} ({later})")
    names = sorted(nb.name for nb in (root/"nbs").glob("*.ipynb") if nb.name != "index.ipynb")
    prefix = {}
    for n in names: prefix.setdefault(n.split("_")[0], []).append(n)
    shared = [f"{p} is the prefix of {', '.join(ns)}" for p, ns in prefix.items() if len(ns) > 1]
    parents = [f"{owner[m]} (package {m}) sorts after {nb} ({c})" for m in owner if m in mods and mods[m].name == "__init__.py"
               for c, nb in owner.items() if c.startswith(m + ".") and nb < owner[m]]
    listed = set(re.findall(r"^\s*-\s*(\S+\.ipynb)\s*$", (root/"nbs"/"sidebar.yml").read_text(), re.M))
    unlisted = sorted(str(nb.relative_to(root/"nbs")) for nb in (root/"nbs").rglob("*.ipynb")
                      if ".ipynb_checkpoints" not in nb.parts and str(nb.relative_to(root/"nbs")) not in listed)
    return [("no import cycle between package modules", cycles(edges)),
            ("no re-export shim (a module-level __getattr__ outside a package __init__)", shims),
            ("no private name imported across modules; no entry point naming one", private),
            ("a notebook imports only modules whose notebooks sort before its own", order),
            ("no two notebooks share a number prefix", shared),
            ("a package's notebook sorts before its children's", parents),
            ("every notebook has its place in the site's map (nbs/sidebar.yml)", unlisted)]


def main() -> int:
    broken = 0
    for rule, bad in check():
        print(f"{'PASS' if not bad else 'FAIL'} {rule}")
        for b in bad: print(f"     {b}")
        broken += bool(bad)
    return broken


if __name__ == "__main__":
    sys.exit(main())
