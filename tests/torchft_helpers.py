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
