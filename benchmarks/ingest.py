"""Benchmark: Claude Code ingestion throughput (MB/s) and peak RSS on a ~100 MB synthetic project folder.

The folder is built in a temp dir from the real fixtures' patterns (../shared/fixtures/claude_code): every fixture
session is repeated with fresh uuids / message ids / tool ids, several copies per session file (long sessions), in the
2.1.x layout (sessions + <session>/subagents/agent-*.jsonl) plus 1.0.x sessions with inline sidechains. Each
configuration runs in its own subprocess (clean peak RSS); a baseline reads and parses every line with orjson only.

    python benchmarks/ingest.py [--mb 100] [--copies 8] [--keep DIR]

Prints a table (wall-clock MB/s, and MB per CPU-second, which shared cores disturb less; "vs parse" is the CPU
throughput relative to the parse-only baseline) and writes benchmarks/results/ingest.json.
"""
import argparse, json, os, re, resource, subprocess, sys, tempfile, time, uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT.parent / "shared" / "fixtures" / "claude_code"
_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_IDS = re.compile(rb"\b(msg_[A-Za-z0-9]+|toolu_[A-Za-z0-9]+|req_[A-Za-z0-9]+)")
_TS = re.compile(rb'("timestamp": ?"[^"]*?)(Z?")')

def _fresh(lines, tag):
    "Rewrite every uuid / message id / tool id / timestamp in `lines` so that copies are distinct sessions or turns (not resume copies)."
    t = tag.encode()
    def u(m): return str(uuid.uuid5(uuid.NAMESPACE_OID, (m.group(0) + t).decode())).encode()
    return [_TS.sub(lambda m: m.group(1) + b"." + t + m.group(2), _IDS.sub(lambda m: m.group(0) + t, _UUID.sub(u, l))) for l in lines]

def build(dst: Path, target_mb: float, copies: int) -> int:
    "Write sessions until the folder holds about target_mb; return its size in bytes."
    srcs = {f.name: f.read_bytes().splitlines(keepends=True) for f in FIX.glob("*.jsonl") if not f.name.startswith("07_")}
    agents = {f.name: f.read_bytes().splitlines(keepends=True) for f in FIX.rglob("agent-*.jsonl")}
    proj = dst / "-home-user-project"; proj.mkdir(parents=True)
    total, k = 0, 0
    while total < target_mb * 1e6:
        for name, lines in sorted(srcs.items()):
            sid = str(uuid.uuid4())
            body = [l for c in range(copies) for l in _fresh(lines, f"{k}.{c}")]
            (proj / f"{sid}.jsonl").write_bytes(b"".join(body)); total += sum(map(len, body))
            if name.startswith("02_"):  # 2.1.x parent: give it a subagents folder
                sub = proj / sid / "subagents"; sub.mkdir(parents=True)
                for an, al in agents.items():
                    body = _fresh(al, f"{k}")
                    (sub / an).write_bytes(b"".join(body)); total += sum(map(len, body))
            k += 1
    return total

def run_one(cfg: str, folder: str) -> dict:
    "Run one configuration in this process and return its figures."
    sys.path.insert(0, str(ROOT))
    import orjson
    nbytes = sum(f.stat().st_size for f in Path(folder).rglob("*.jsonl"))
    t0, c0 = time.perf_counter(), time.process_time(); n = 0
    if cfg == "orjson-parse-only":
        for f in sorted(Path(folder).rglob("*.jsonl")):
            with open(f, "rb") as fh:
                for line in fh:
                    orjson.loads(line); n += 1
        extra = {"lines": n}
    else:
        from composer_replication.ingestion.claude_code import ClaudeCodeIngester
        kw = {"redact": dict(), "no-redact": dict(redact_secrets=False), "sidechains": dict(skip_sidechain=False),
              "max-history": dict(max_history_tokens=8000)}[cfg]
        ing = ClaudeCodeIngester(**kw)
        for s in ing.ingest(Path(folder)): n += 1
        st = ing.last_stats
        extra = {"states": n, "records": st.n_records_total, "files": st.n_files, "redactions": sum(st.redactions.values())}
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"config": cfg, "mb": nbytes / 1e6, "seconds": dt, "mb_per_s": nbytes / 1e6 / dt, "cpu_seconds": cpu,
            "mb_per_cpu_s": nbytes / 1e6 / cpu, "peak_rss_mb": rss, **extra}

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=100); ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--keep", default=None); ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--configs", default="orjson-parse-only,redact,no-redact,sidechains,max-history")
    a = ap.parse_args()
    if a.one: print(json.dumps(run_one(*a.one))); return
    if not FIX.exists(): sys.exit(f"fixtures missing: {FIX}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.keep) if a.keep else Path(tmp)
        if not any(folder.rglob("*.jsonl")): build(folder, a.mb, a.copies)
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
        rows = []
        for cfg in a.configs.split(","):
            out = subprocess.run([sys.executable, __file__, "--one", cfg, str(folder)], capture_output=True, text=True, env=env)
            if out.returncode: sys.exit(out.stderr)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]["mb_per_cpu_s"] if rows[0]["config"] == "orjson-parse-only" else None
    print(f"{'config':<20}{'MB':>8}{'wall s':>8}{'MB/s':>8}{'MB/cpu-s':>10}{'vs parse':>10}{'peak RSS MB':>13}{'states':>9}")
    for r in rows:
        ratio = f"{r['mb_per_cpu_s'] / base:.2f}" if base else "-"
        print(f"{r['config']:<20}{r['mb']:>8.1f}{r['seconds']:>8.2f}{r['mb_per_s']:>8.1f}{r['mb_per_cpu_s']:>10.1f}{ratio:>10}"
              f"{r['peak_rss_mb']:>13.0f}{r.get('states', '-'):>9}")
    res = ROOT / "benchmarks" / "results"; res.mkdir(parents=True, exist_ok=True)
    (res / "ingest.json").write_text(json.dumps({"rows": rows, "note": "2 shared cores, timings under contention"}, indent=1))

if __name__ == "__main__": main()
