"""Benchmark: teacher replay throughput against the local teacher server (wall time vs the ideal, calls/s).

1,000 states x 3 teachers against `composer_replication.teacher_server.TeacherServer` at 50 ms latency, 64 calls
in flight. The ideal wall time is calls x latency / concurrency (3,000 x 0.05 / 64 = 2.34 s); the target is <= 1.3x.
The server runs in its own process; each client configuration runs in its own subprocess (clean peak RSS):

- `httpx-1pool`     replay_trace over one httpx connection pool of 64 (shows encode/httpx#3215)
- `httpx`           replay_trace(transport="httpx"): httpx pools split into pools of <= 4 connections (the fallback
                    when aiohttp is not installed)
- `httpx-aiohttp`   replay_trace over httpx's API on aiohttp's pool (an httpx_aiohttp.AiohttpTransport)
- `aiohttp`         replay_trace(transport="aiohttp"): one aiohttp session (the default when aiohttp is importable)
- `default`         replay_trace with no transport argument
- `...+journal`     any of the above, also writing the fsync'd JSONL journal (e.g. `aiohttp+journal`)
- `raw-aiohttp`     no replay logic at all: the same request bodies POSTed with aiohttp under a semaphore (the floor
                    set by the server and the machine)

Imports (httpx, aiohttp, httpx-aiohttp: ~0.2 s, paid once per process) happen before the clocks start.

    python benchmarks/replay.py [--states 1000] [--teachers 3] [--latency 0.05] [--concurrency 64] [--impls ...]

Prints a table and writes benchmarks/results/replay.json. Timings depend on the load of the machine.
"""
import argparse, asyncio, json, os, resource, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPLS = ["httpx-1pool", "httpx", "httpx-aiohttp", "aiohttp", "default+journal", "raw-aiohttp"]


def make_states(n):
    sys_msg = {"role": "system", "content": "You are a coding agent working in a terminal."}
    return [{"state_id": f"bench::{i:05d}",
             "messages": [sys_msg, {"role": "user", "content": f"Task {i}: fix the failing test in module_{i % 97}.py"},
                          {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function",
                           "function": {"name": "Read", "arguments": json.dumps({"file_path": f"module_{i % 97}.py"})}}]},
                          {"role": "tool", "tool_call_id": f"c{i}", "content": "def f():\n    return 1\n" * 20}],
             "student_action": '[TOOL_USE] name=Bash input={"command": "pytest -x"}'} for i in range(n)]


def teachers(k):
    return [{"slug": f"bench/t{j}", "input_per_mtok": 1.0, "output_per_mtok": 2.0} for j in range(k)]


def serve(latency, k):
    "Run the teacher server until stdin closes; print its base URL first."
    sys.path.insert(0, str(ROOT))
    from composer_replication.teacher_server import ModelPolicy, TeacherServer
    reply = {"content": None, "tool_calls": [{"name": "Bash", "arguments": {"command": "pytest -x tests/"}}]}
    pol = {t["slug"]: ModelPolicy(reply=reply, latency_s=latency, input_per_mtok=1.0, output_per_mtok=2.0) for t in teachers(k)}
    with TeacherServer(pol) as srv:
        print(srv.url, flush=True)
        sys.stdin.read()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps({"calls": srv.calls, "max_in_flight": srv.max_in_flight,
                          "cpu_ms_per_call": 1e3 * (ru.ru_utime + ru.ru_stime) / max(1, srv.calls)}), flush=True)


def run_one(impl, url, n, k, conc):
    "One client configuration in this process; returns its figures."
    sys.path.insert(0, str(ROOT))
    import orjson
    from composer_replication.teacher_replay import replay_trace, teacher_request, tool_specs
    import httpx
    try: import aiohttp, httpx_aiohttp  # noqa: F401  (imported up front, like httpx: a one-off cost, not per call)
    except ImportError: pass
    states, T = make_states(n), teachers(k)
    ru = resource.getrusage(resource.RUSAGE_SELF); cpu0 = ru.ru_utime + ru.ru_stime   # after imports
    t0 = time.perf_counter()
    if impl == "raw-aiohttp":
        import aiohttp
        tools = tool_specs(states)
        bodies = [orjson.dumps(teacher_request(s, t, tools=tools)) for s in states for t in T]
        async def go():
            sem = asyncio.Semaphore(conc)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as sess:
                async def one(b):
                    async with sem:
                        async with sess.post(url + "/chat/completions", data=b, headers={"Content-Type": "application/json"}) as r:
                            orjson.loads(await r.read())
                await asyncio.gather(*[one(b) for b in bodies])
        t0 = time.perf_counter(); asyncio.run(go()); ok = len(bodies)
    else:
        with tempfile.TemporaryDirectory() as d:
            base = impl.removesuffix("+journal")
            limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
            transport = {"httpx": "httpx", "aiohttp": "aiohttp", "default": None,
                         "httpx-1pool": lambda: httpx.AsyncHTTPTransport(limits=limits),
                         "httpx-aiohttp": lambda: httpx_aiohttp.AiohttpTransport(limits=limits)}[base]
            kw = dict(base_url=url, max_concurrency=conc, max_total_usd=1e9, progress=False,
                      transport=transport() if callable(transport) else transport,
                      journal=Path(d) / "j.jsonl" if impl.endswith("+journal") else None)
            t0 = time.perf_counter()
            res = asyncio.run(replay_trace(states, T, **kw))
            ok = sum(r["error"] is None for r in res)
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"impl": impl, "calls": n * k, "ok": ok, "wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime - cpu0,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--states", type=int, default=1000); ap.add_argument("--teachers", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.05); ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--impls", default=",".join(IMPLS)); ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--serve", action="store_true"); ap.add_argument("--worker"); ap.add_argument("--url")
    a = ap.parse_args()
    if a.serve: return serve(a.latency, a.teachers)
    if a.worker: return print(json.dumps(run_one(a.worker, a.url, a.states, a.teachers, a.concurrency)))
    calls = a.states * a.teachers
    ideal = calls * a.latency / a.concurrency
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    srv = subprocess.Popen([sys.executable, __file__, "--serve", "--latency", str(a.latency), "--teachers", str(a.teachers)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        url = srv.stdout.readline().strip()
        rows = []
        for impl in a.impls.split(","):
            best = None
            for _ in range(a.repeat):
                p = subprocess.run([sys.executable, __file__, "--worker", impl, "--url", url, "--states", str(a.states),
                                    "--teachers", str(a.teachers), "--concurrency", str(a.concurrency)],
                                   capture_output=True, text=True, env=env, timeout=600)
                if p.returncode != 0: print(p.stderr[-2000:], file=sys.stderr); raise SystemExit(f"{impl} failed")
                r = json.loads(p.stdout.strip().splitlines()[-1])
                best = r if best is None or r["wall_s"] < best["wall_s"] else best
            best.update(ideal_s=ideal, ratio=best["wall_s"] / ideal, calls_per_s=best["calls"] / best["wall_s"],
                        cpu_ms_per_call=1e3 * best["cpu_s"] / best["calls"])
            rows.append(best)
            print(f"{impl:16s} wall {best['wall_s']:6.2f} s  ideal {ideal:5.2f} s  ratio {best['ratio']:5.2f}x  "
                  f"{best['calls_per_s']:6.0f} calls/s  client CPU {best['cpu_ms_per_call']:.3f} ms/call  "
                  f"ok {best['ok']}/{best['calls']}  rss {best['peak_rss_mb']:.0f} MB", flush=True)
    finally:
        out, _ = srv.communicate("", timeout=30)
    server = json.loads(out.strip().splitlines()[-1])
    print(f"server: {server['calls']} calls, at most {server['max_in_flight']} in flight, {server['cpu_ms_per_call']:.3f} ms CPU/call; "
          f"target <= 1.3x ideal, i.e. client + server CPU < {1e3 * a.latency / a.concurrency / 1.3 * 1.3:.2f} ms/call on one core each")
    res = {"config": vars(a) | {"calls": calls, "ideal_s": ideal}, "rows": rows, "server": server,
           "load_avg": os.getloadavg(), "cpus": os.cpu_count()}
    outp = ROOT / "benchmarks" / "results" / "replay.json"; outp.parent.mkdir(parents=True, exist_ok=True)
    outp.write_text(json.dumps(res, indent=1)); print("wrote", outp)


if __name__ == "__main__":
    main()
