"""Benchmark: secret redaction measured both ways (issue 35 point 1).

(a) False positives: strings of ordinary code that come back changed. The corpus is real code: files of the packages
    installed in .venv (.py, .json, .yaml, .toml, .cfg, .md) and in benchmarks/.deps/node_modules (.js, .ts; `npm install`
    a few packages there first, see benchmarks/README.md), sampled deterministically, test folders and files that
    deliberately hold fake keys excluded; and every JSON string of the real sessions in ../shared/fixtures/claude_code/.
(b) True positives: gitleaks' rule test cases (benchmarks/data/gitleaks_tp.jsonl.gz, see SOURCES.md), as written and
    bare (the secret alone in a sentence, for the tokens with a fixed prefix); and issue 35's families
    (tests/secret_families.py), each as user text, inside a tool result (JSON text) and inside a tool input (redact_json).
    A case is caught when its secret no longer appears in the output.
(c) Time: ingesting the real sessions (ClaudeCodeIngester, CPU seconds; the sessions repeated with fresh ids to ~20 MB by
    benchmarks/ingest.py's builder) with this checkout and with `--baseline REV`, in separate processes, best of 3.

    python benchmarks/redaction.py [--files 3000] [--baseline 41c1168] [--detect-secrets] [--show 20]

Writes benchmarks/results/redaction.json.
"""
import argparse, gzip, hashlib, json, os, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]
SESSIONS = ROOT.parent / "shared" / "fixtures" / "claude_code"
EXTS = {".py", ".js", ".ts", ".json", ".yaml", ".yml", ".toml", ".cfg", ".md"}
_SKIP_DIRS = {"tests", "test", "testing", "__tests__", "fixtures", "testdata", "examples", "spec"}
_FAKE_KEYS = ("detect_secrets", "secret", "credential", "token_test", "rstr")  # scanners and their sample keys

def code_files(n: int) -> list[Path]:
    "Up to `n` real code files: a deterministic sample (by a hash of the path) spread over the extensions."
    roots = sorted((ROOT / ".venv" / "lib").glob("python*/site-packages")) + [ROOT / "benchmarks" / ".deps" / "node_modules"]
    by_ext = {}
    for r in roots:
        for dp, dns, fns in os.walk(r):
            dns[:] = [d for d in dns if d not in _SKIP_DIRS and not d.startswith(".")]
            for fn in fns:
                p = Path(dp) / fn; ext = ".yaml" if p.suffix == ".yml" else p.suffix
                if ext not in EXTS or fn.startswith("test_") or fn.endswith(("_test.py", ".test.js", ".min.map")): continue
                if any(k in str(p.relative_to(r)).lower() for k in _FAKE_KEYS): continue
                try: size = p.stat().st_size
                except OSError: continue
                if 0 < size <= 400_000: by_ext.setdefault(ext, []).append(p)
    key = lambda p: hashlib.sha1(str(p).encode()).hexdigest()
    per = max(1, n // len(by_ext)); out = []
    for ext, ps in sorted(by_ext.items()): out += sorted(ps, key=key)[:per]
    rest = sorted((p for ps in by_ext.values() for p in ps if p not in set(out)), key=key)
    return out + rest[:max(0, n - len(out))]

def _strings(o):
    if isinstance(o, str): yield o
    elif isinstance(o, dict):
        for k, v in o.items(): yield k; yield from _strings(v)
    elif isinstance(o, list):
        for v in o: yield from _strings(v)

def session_strings() -> list[str]:
    import orjson
    out = []
    for f in sorted(SESSIONS.rglob("*.jsonl")):
        for l in f.read_bytes().splitlines():
            try: out += list(_strings(orjson.loads(l)))
            except orjson.JSONDecodeError: pass  # the deliberately truncated last line
    return out

def _diff(a, b, width=70):
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[max(0, i - 30):i + 40].replace("\n", "\\n")

def false_positives(redact, files, strs, show=0):
    changed, shown = [], 0
    for p in files:
        t = p.read_text(errors="replace")
        if redact(t) != t:
            changed.append(str(p))
            if shown < show: print(f"  FP file {p.name}: ...{_diff(t, redact(t))}..."); shown += 1
    ch_s = [s for s in strs if redact(s) != s]
    for s in ch_s[:show]: print(f"  FP session string: ...{_diff(s, redact(s))}...")
    return {"code_files": len(files), "code_files_changed": len(changed), "changed_files": changed,
            "session_strings": len(strs), "session_strings_changed": len(ch_s)}

def gitleaks_cases():
    with gzip.open(ROOT / "benchmarks" / "data" / "gitleaks_tp.jsonl.gz", "rt") as fh: return [json.loads(l) for l in fh]

def _json_back(redact, text):
    "`text` inside a tool result, redacted as JSON text and read back (the raw output where the redactor broke the JSON)."
    out = redact(json.dumps({"type": "tool_result", "content": text}))
    try: return json.loads(out)["content"]
    except json.JSONDecodeError: return out

def true_positives(redact, redact_json, show=0, every=1):
    from secret_families import FAMILIES
    cs = gitleaks_cases()[::every]
    missed = [c for c in cs if c["secret"] in redact(c["text"])]
    pre = [c for c in cs if c["unique_prefix"]]
    bare = [f"the value is {c['secret']} (from the dashboard)" for c in pre]
    missed_bare = [c for c, t in zip(pre, bare) if c["secret"] in redact(t)]
    fam_miss = []
    for fam, text, secrets in FAMILIES:
        outs = {"user text": redact(text), "tool result": _json_back(redact, text),
                "tool input": redact_json({"command": text})["command"]}
        for where, o in outs.items():
            if any(s in o for s in secrets): fam_miss.append(f"{fam} ({where})")
    for c in (missed + missed_bare)[:show]: print(f"  missed {c['rule']}: {c['text'][:100]!r}")
    for f in fam_miss[:show]: print(f"  missed family: {f}")
    return {"gitleaks_cases": len(cs), "gitleaks_caught": len(cs) - len(missed), "gitleaks_rules": len({c["rule"] for c in cs}),
            "gitleaks_rules_missed": sorted({c["rule"] for c in missed}),
            "prefixed_bare": len(pre), "prefixed_bare_caught": len(pre) - len(missed_bare),
            "families": len(FAMILIES) * 3, "families_caught": len(FAMILIES) * 3 - len(fam_miss), "families_missed": fam_miss}

_INGEST = """
import sys, time; sys.path.insert(0, sys.argv[1])
from pathlib import Path
from composer_replication.ingestion.claude_code import ClaudeCodeIngester
ing = ClaudeCodeIngester(); ws = []
for _ in range(int(sys.argv[3])):
    c0 = time.process_time(); n = sum(1 for _ in ing.ingest(Path(sys.argv[2]))); ws.append(time.process_time() - c0)
print(min(ws), n)
"""

def ingest_time(src: Path, folder: Path, reps=3):
    out = subprocess.run([sys.executable, "-c", _INGEST, str(src), str(folder), str(reps)], capture_output=True, text=True, check=True)
    t, n = out.stdout.split(); return float(t), int(n)

def detect_secrets_redactor():
    "detect-secrets (Yelp) as a redactor: its file scan (default plugins and filters) over the text's lines; each secret found is replaced."
    from detect_secrets.core.scan import _process_line_based_plugins  # what scan_file runs (scan_line is its eager ad-hoc mode)
    from detect_secrets.settings import default_settings
    def redact(text):
        lines = text.split("\n")
        with default_settings():
            found = list(_process_line_based_plugins(lines=list(enumerate(lines, 1)), filename="trace.txt"))
        for sec in found:
            if sec.secret_value: lines[sec.line_number - 1] = lines[sec.line_number - 1].replace(sec.secret_value, "[REDACTED]")
        return "\n".join(lines)
    def redact_json(v):
        if isinstance(v, str): return redact(v)
        if isinstance(v, dict): return {k: redact_json(x) for k, x in v.items()}
        if isinstance(v, list): return [redact_json(x) for x in v]
        return v
    return redact, redact_json

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=3000); ap.add_argument("--baseline", default=None)
    ap.add_argument("--detect-secrets", action="store_true"); ap.add_argument("--show", type=int, default=0)
    a = ap.parse_args()
    from composer_replication.ingestion.redact import redact_json, redact_secrets
    files, strs = code_files(a.files), session_strings()
    res = {}
    t0 = time.process_time()
    res["ours"] = {**false_positives(redact_secrets, files, strs, a.show), **true_positives(redact_secrets, redact_json, a.show)}
    res["ours"]["cpu_seconds"] = round(time.process_time() - t0, 2)
    if a.detect_secrets:
        r, rj = detect_secrets_redactor(); t0 = time.process_time()
        sub = files[:300]  # it is slow: a tenth of the files, the first 3,000 session strings, every 4th gitleaks case
        res["detect_secrets"] = {**false_positives(r, sub, strs[:3000]), **true_positives(r, rj, every=4), "cpu_seconds": round(time.process_time() - t0, 2)}
        t0 = time.process_time(); [redact_secrets(p.read_text(errors="replace")) for p in sub]; res["detect_secrets"]["ours_cpu_seconds_same_files"] = round(time.process_time() - t0, 3)
    if a.baseline:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(f"git -C {ROOT} archive {a.baseline} composer_replication | tar -x -C {tmp}", shell=True, check=True)
            from ingest import build
            folder = Path(tmp) / "sessions"; mb = build(folder, 20, 4) / 1e6
            tb, nb = ingest_time(Path(tmp), folder); tn, nn = ingest_time(ROOT, folder)
        res["ingest"] = {"baseline": a.baseline, "baseline_cpu_s": round(tb, 3), "cpu_s": round(tn, 3), "ratio": round(tn / tb, 2), "states": [nb, nn], "mb": round(mb, 1)}
    for name, r in res.items():
        if name == "ingest": continue
        print(f"{name}: code files changed {r['code_files_changed']}/{r['code_files']}, session strings changed {r['session_strings_changed']}/{r['session_strings']}; "
              f"gitleaks cases caught {r['gitleaks_caught']}/{r['gitleaks_cases']} ({r['gitleaks_rules']} rules), prefixed bare {r['prefixed_bare_caught']}/{r['prefixed_bare']}, "
              f"families {r['families_caught']}/{r['families']}; {r['cpu_seconds']} CPU s")
    if "ingest" in res: print("ingest of the real sessions ({mb} MB, {states[1]} states): {cpu_s} CPU s vs {baseline_cpu_s} at {baseline}: {ratio}x".format(**res["ingest"]))
    out = ROOT / "benchmarks" / "results"; out.mkdir(parents=True, exist_ok=True)
    (out / "redaction.json").write_text(json.dumps(res, indent=1))

if __name__ == "__main__": main()
