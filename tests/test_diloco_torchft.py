"""DiLoCo on the real torchft engine: a lighthouse on 127.0.0.1 and replica groups (one process each, ProcessGroupGloo,
own TCPStore) training the tiny LM with `make_diloco_outer_loop`. One replica is killed mid-run and the other keeps
committing; a new replica with different initial weights heals from its peer and rejoins. Everything started is stopped."""
import os, signal, sys, time
from pathlib import Path

import pytest

pytest.importorskip("torchft")
sys.path.insert(0, str(Path(__file__).parent))
from torchft_helpers import LIGHTHOUSE, REPO, events, free_port, start, start_lighthouse, stop, syncs, wait_for  # noqa: E402

WORKER = Path(__file__).with_name("diloco_torchft_worker.py")


@pytest.mark.skipif(not LIGHTHOUSE.exists(), reason="torchft_lighthouse binary not found next to the interpreter")
def test_torchft_diloco_kill_and_heal(tmp_path):
    procs, logs = [], []
    def log(name):
        p = tmp_path / f"{name}.log"; logs.append(p); return open(p, "w")
    lighthouse, lh_port = start_lighthouse(log("lighthouse"))
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
