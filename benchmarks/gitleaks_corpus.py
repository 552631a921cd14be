"""Build benchmarks/data/gitleaks_tp.jsonl.gz: gitleaks' rule test cases (true positives) with the secret each one holds.

gitleaks (https://github.com/gitleaks/gitleaks, MIT) checks every rule against a list of true positives written in Go
(cmd/generate/config/rules/*.go). This script reads those lists without a Go toolchain: literal strings are taken as
they are, `secrets.NewSecret(regex)` is drawn with `rstr` (seeded), `utils.GenerateSampleSecrets` expands to gitleaks'
own contexts (INI, JSON, YAML, Go, Java, Python, Makefile...). The secret in each case is what the rule's regex
(config/gitleaks.toml, its secretGroup) extracts, matched with google-re2 (Go's RE2 syntax).

    pip install rstr; python benchmarks/gitleaks_corpus.py /path/to/gitleaks-checkout
"""
import gzip, json, random, re, sys, tomllib
from pathlib import Path

_TOK = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"|`[^`]*`|[A-Za-z_][\w.]*|\.\.\.|:=|[(){}\[\],+=]|\S', re.S)

def _go_str(t):
    if t[0] == "`": return t[1:-1]
    return json.loads(t) if "\\x" not in t else bytes(t[1:-1], "utf-8").decode("unicode_escape")

_PAT = {"utils.Numeric": "[0-9]{%s}", "utils.Hex": "[a-f0-9]{%s}", "utils.AlphaNumeric": "[a-z0-9]{%s}",
        "utils.AlphaNumericExtendedShort": "[a-z0-9_-]{%s}", "utils.AlphaNumericExtended": "[a-z0-9=_\\-]{%s}",
        "utils.AlphaNumericExtendedLong": "[a-z0-9\\/=_\\+\\-]{%s}"}
_SAMPLES = None

def _samples(i, s):
    return [t.replace("{i}", i).replace("{I}", i.upper()).replace("{s}", s) for t in _SAMPLES]

class _P:
    "A tiny evaluator for the expressions gitleaks writes its test lists in."
    def __init__(self, toks, env, rng, xeger): self.t, self.i, self.env, self.rng, self.xeger = toks, 0, env, rng, xeger
    def peek(self): return self.t[self.i] if self.i < len(self.t) else None
    def take(self, want=None):
        t = self.t[self.i]; self.i += 1
        if want is not None and t != want: raise ValueError(f"want {want} got {t}")
        return t
    def expr(self):
        v = self.atom()
        while self.peek() == "+": self.take(); v = v + self.atom()
        return v
    def args(self):
        self.take("("); out = []
        while self.peek() != ")":
            out.append(self.expr())
            if self.peek() == "...": self.take(); out[-1] = ("spread", out[-1])
            if self.peek() == ",": self.take()
        self.take(")"); return out
    def atom(self):
        t = self.take()
        if t[0] in '"`': return _go_str(t)
        if t == "[]string":
            self.take("{"); out = []
            while self.peek() != "}":
                start = self.i
                try: out.append(self.expr())
                except Exception:  # an expression this evaluator does not know: skip to the next element
                    self.i, depth = start, 0
                    while not (depth == 0 and self.peek() in (",", "}")):
                        c = self.take(); depth += c in "([{"; depth -= c in ")]}"
                if self.peek() == ",": self.take()
            self.take("}"); return out
        if t in _PAT: return _PAT[t] % self.args()[0]
        if t == "utils.Hex8_4_4_4_12": self.args(); return "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
        if t == "secrets.NewSecret": return self.xeger(self.args()[0])
        if t == "utils.GenerateSampleSecrets": a = self.args(); return _samples(*a)
        if t == "utils.GenerateSampleSecret": a = self.args(); return f'{a[0]}_api_token = "{a[1]}"'
        if t == "append":
            a = self.args(); out = list(a[0])
            for x in a[1:]: out += list(x[1]) if isinstance(x, tuple) else [x]
            return out
        if t == "strings.Repeat": a = self.args(); return a[0] * int(a[1]) if isinstance(a[1], int) else a[0] * int(self.env.get(a[1], 1))
        if t.isdigit(): return int(t)
        if t in self.env: return self.env[t]
        raise ValueError(f"unknown {t}")

def cases(repo: Path, seed=0):
    import rstr, re2
    global _SAMPLES
    gen = (repo / "cmd/generate/config/utils/generate.go").read_text()
    body = gen[gen.index("func GenerateSampleSecrets"):]; body = body[:body.index("replacer :=")]
    _SAMPLES = [_go_str(m.group(2)) for m in re.finditer(r'^\s*("[^"]+"):\s*("(?:[^"\\]|\\.)*"|`[^`]*`),', body, re.M)]
    rules = {r["id"]: r for r in tomllib.loads((repo / "config/gitleaks.toml").read_text())["rules"]}
    rng = random.Random(seed); rs = rstr.Rstr(rng)
    def xeger(p): return rs.xeger(re.sub(r"\(\?i\)", "", p))
    out = []
    for f in sorted((repo / "cmd/generate/config/rules").glob("*.go")):
        src = f.read_text()
        for fn in re.split(r"\nfunc ", src)[1:]:
            m = re.search(r'RuleID:\s*"([^"]+)"', fn)
            if not m or m.group(1) not in rules: continue
            rule = rules[m.group(1)]
            toks = [t for t in _TOK.findall(fn) if not t.startswith(("//", "/*"))]
            env, tps = {}, []
            for k in range(len(toks) - 2):
                if toks[k + 1] in (":=", "=") and toks[k].isidentifier() and toks[k] not in ("r",):
                    p = _P(toks, env, rng, xeger); p.i = k + 2
                    try: v = p.expr()
                    except Exception: continue
                    env[toks[k]] = v
                    if toks[k] == "tps" and isinstance(v, list): tps = v
            if "regex" not in rule: continue  # a path-only rule
            rx = re2.compile(rule["regex"])
            for t in tps:
                if not isinstance(t, str): continue
                mm = rx.search(t)
                if not mm: continue
                g = rule.get("secretGroup", 0)
                sec = mm.group(g) if g else next((x for x in mm.groups() if x), mm.group(0))
                out.append({"rule": rule["id"], "text": t, "secret": sec, "unique_prefix": "GenerateUniqueTokenRegex" in fn})
    return out

if __name__ == "__main__":
    repo = Path(sys.argv[1])
    cs = cases(repo)
    dst = Path(__file__).parent / "data" / "gitleaks_tp.jsonl.gz"
    with gzip.open(dst, "wt", compresslevel=9) as fh:
        for c in cs: fh.write(json.dumps(c, ensure_ascii=False) + "\n")
    print(len(cs), "cases,", len({c["rule"] for c in cs}), "rules ->", dst)
