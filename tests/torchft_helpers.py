"""Process helpers shared by the torchft tests (tests/test_diloco_torchft.py, tests/test_diloco_trainers.py): a free port on
127.0.0.1, processes started in their own group and stopped with their children, the JSONL event logs replicas write."""
import json, os, signal, socket, subprocess, sys, time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIGHTHOUSE = Path(sys.executable).with_name("torchft_lighthouse")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def start(cmd, log, env=None):
    "Start a process in its own process group (so it and its children can be stopped together)."
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)


def stop(p, sig=signal.SIGTERM):
    if p.poll() is None:
        try: os.killpg(p.pid, sig)
        except ProcessLookupError: return
        try: p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL); p.wait(10)


def events(path: Path) -> list[dict]:
    if not path.exists(): return []
    out = []
    for line in path.read_text().splitlines():
        try: out.append(json.loads(line))
        except json.JSONDecodeError: pass  # a line being written
    return out


def syncs(path, **match):
    return [e for e in events(path) if e["event"] == "sync" and all(e.get(k) == v for k, v in match.items())]


def wait_for(pred, what: str, timeout: float, procs=(), logs=()):
    "Poll `pred` until it holds; fail with the logs' tails if a watched process exits or `timeout` seconds pass."
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred(): return
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a process exited with {p.returncode} while waiting for {what}:\n" + "\n".join(Path(l).read_text()[-3000:] for l in logs))
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}:\n" + "\n".join(Path(l).read_text()[-3000:] for l in logs))


def start_lighthouse(log) -> tuple[subprocess.Popen, int]:
    "A torchft Lighthouse on 127.0.0.1 (one replica is a quorum; fast heartbeats and ticks for tests): (process, port)."
    port = free_port()
    p = start([str(LIGHTHOUSE), "--min_replicas", "1", "--bind", f"127.0.0.1:{port}",
               "--join_timeout_ms", "60000", "--heartbeat_timeout_ms", "2000", "--quorum_tick_ms", "50"], log)
    return p, port


def kill_and_heal(tmp_path: Path, launch, timeout: float = 240) -> list[dict]:
    """The fault-tolerance scenario of the torchft tests, under a Lighthouse on 127.0.0.1:
    1. replica groups a and b (same initial weights) commit together, with equal weights after each joint commit;
    2. b is killed (SIGKILL) mid-run and a keeps committing alone;
    3. c, with other initial weights, heals from a (it jumps to a's step) and commits with it, with a's weights.
    `launch(name, seed, lighthouse_port, log_file) -> Popen` starts one group writing its events to `tmp_path/<name>.jsonl`.
    Everything started is stopped; returns a's events."""
    procs, logs = [], []
    def log(name):
        p = tmp_path / f"{name}.log"; logs.append(p); return open(p, "w")
    lighthouse, port = start_lighthouse(log("lighthouse"))
    procs.append(lighthouse)
    def replica(name, seed):
        p = launch(name, seed, port, log(name)); procs.append(p); return p
    try:
        a, b = replica("a", 0), replica("b", 0)
        A, B, C = (tmp_path / f"{n}.jsonl" for n in "abc")
        wait_for(lambda: len(syncs(A, committed=True, participants=2)) >= 2 and len(syncs(B, committed=True, participants=2)) >= 2,
                 "two joint commits", timeout, [a, b, lighthouse], logs)
        both = {e["manager_step"]: e["digest"] for e in syncs(A, committed=True, participants=2)}
        shared = [e for e in syncs(B, committed=True, participants=2) if e["manager_step"] in both]
        assert shared and all(e["digest"] == both[e["manager_step"]] for e in shared), "replica groups disagree after a joint commit"
        stop(b, signal.SIGKILL); killed_at = time.time()
        wait_for(lambda: len([e for e in syncs(A, committed=True, participants=1) if e["t"] > killed_at]) >= 2,
                 "a committing alone after b died", timeout * 0.6, [a, lighthouse], logs)
        step_alone = max(e["manager_step"] for e in syncs(A, committed=True))
        c = replica("c", 1)
        wait_for(lambda: len(syncs(C, committed=True, participants=2)) >= 2, "c healed and committing with a", timeout, [a, c, lighthouse], logs)
        c_start = next(e for e in events(C) if e["event"] == "started")
        assert c_start["digest"] != next(e for e in events(A) if e["event"] == "started")["digest"]  # really another init
        c_syncs = syncs(C, committed=True, participants=2)
        assert c_syncs[0]["manager_step"] > step_alone, (c_syncs[0], step_alone)  # jumped to a's step: healed, not started from 0
        a_by_step = {e["manager_step"]: e["digest"] for e in syncs(A, committed=True)}
        common = [e for e in c_syncs if e["manager_step"] in a_by_step]
        assert common and all(e["digest"] == a_by_step[e["manager_step"]] for e in common), "c's weights differ from a's after rejoining"
        return events(A)
    finally:
        for p in reversed(procs): stop(p)
        for p in procs: assert p.poll() is not None
