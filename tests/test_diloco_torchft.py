"""DiLoCo on the real torchft engine: a lighthouse on 127.0.0.1 and replica groups (one process each, ProcessGroupGloo,
own TCPStore) training the tiny LM with `make_diloco_outer_loop`. One replica is killed mid-run and the other keeps
committing; a new replica with different initial weights heals from its peer and rejoins. Everything started is stopped."""
import json, os, signal, socket, subprocess, sys, time
from pathlib import Path

import pytest

pytest.importorskip("torchft")
REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("diloco_torchft_worker.py")
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


def wait_for(pred, what: str, timeout: float, procs=(), logs=()):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred(): return
        for p in procs:
            if p.poll() is not None: raise AssertionError(f"a process exited with {p.returncode} while waiting for {what}:\n" + "\n".join(Path(l).read_text()[-3000:] for l in logs))
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}:\n" + "\n".join(Path(l).read_text()[-3000:] for l in logs))


def syncs(path, **match):
    return [e for e in events(path) if e["event"] == "sync" and all(e.get(k) == v for k, v in match.items())]


@pytest.mark.skipif(not LIGHTHOUSE.exists(), reason="torchft_lighthouse binary not found next to the interpreter")
def test_torchft_diloco_kill_and_heal(tmp_path):
    lh_port = free_port()
    procs, logs = [], []
    def log(name):
        p = tmp_path / f"{name}.log"; logs.append(p); return open(p, "w")
    lighthouse = start([str(LIGHTHOUSE), "--min_replicas", "1", "--bind", f"127.0.0.1:{lh_port}",
                        "--join_timeout_ms", "60000", "--heartbeat_timeout_ms", "2000", "--quorum_tick_ms", "50"], log("lighthouse"))
    procs.append(lighthouse)
    def replica(name, seed):
        env = {**os.environ, "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{lh_port}", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1", "PYTHONPATH": str(REPO)}
        p = start([sys.executable, str(WORKER), "--replica-id", name, "--seed", str(seed), "--status-file", str(tmp_path / f"{name}.jsonl")],
                  log(name), env)
        procs.append(p); return p
    try:
        a, b = replica("a", 0), replica("b", 0)
        A, B, C = (tmp_path / f"{n}.jsonl" for n in "abc")
        # 1. both replicas commit together
        wait_for(lambda: len(syncs(A, committed=True, participants=2)) >= 2 and len(syncs(B, committed=True, participants=2)) >= 2,
                 "two joint commits", 240, [a, b, lighthouse], logs)
        both = {e["manager_step"]: e["digest"] for e in syncs(A, committed=True, participants=2)}
        for e in syncs(B, committed=True, participants=2):
            if e["manager_step"] in both: assert e["digest"] == both[e["manager_step"]], "replicas disagree after a joint commit"
        # 2. kill b mid-run: a keeps committing on its own
        stop(b, signal.SIGKILL); killed_at = time.time()
        wait_for(lambda: len([e for e in syncs(A, committed=True, participants=1) if e["t"] > killed_at]) >= 2,
                 "a committing alone after b died", 120, [a, lighthouse], logs)
        step_alone = max(e["manager_step"] for e in syncs(A, committed=True))
        # 3. a new replica with different initial weights heals from a and rejoins
        c = replica("c", 1)
        wait_for(lambda: len(syncs(C, committed=True, participants=2)) >= 2, "c healed and committing with a", 240, [a, c, lighthouse], logs)
        c_start = next(e for e in events(C) if e["event"] == "started")
        assert c_start["digest"] != next(e for e in events(A) if e["event"] == "started")["digest"]  # really a different init
        c_syncs = syncs(C, committed=True, participants=2)
        assert c_syncs[0]["manager_step"] > step_alone, (c_syncs[0], step_alone)  # jumped to a's step: healed, not started from 0
        a_by_step = {e["manager_step"]: e["digest"] for e in syncs(A, committed=True)}
        shared = [e for e in c_syncs if e["manager_step"] in a_by_step]
        assert shared and all(e["digest"] == a_by_step[e["manager_step"]] for e in shared), "c's weights differ from a's after rejoining"
    finally:
        for p in reversed(procs): stop(p)
    for p in procs: assert p.poll() is not None
