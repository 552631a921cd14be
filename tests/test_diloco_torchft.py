"""DiLoCo on the real torchft engine: a lighthouse on 127.0.0.1 and replica groups (one process each, ProcessGroupGloo,
own TCPStore) training the tiny LM with `make_diloco_outer_loop`. One replica is killed mid-run and the other keeps
committing; a new replica with different initial weights heals from its peer and rejoins. Everything started is stopped."""
import os, sys
from pathlib import Path

import pytest

pytest.importorskip("torchft")
sys.path.insert(0, str(Path(__file__).parent))
from torchft_helpers import LIGHTHOUSE, REPO, free_port, kill_and_heal, start  # noqa: E402

WORKER = Path(__file__).with_name("diloco_torchft_worker.py")


@pytest.mark.skipif(not LIGHTHOUSE.exists(), reason="torchft_lighthouse binary not found next to the interpreter")
def test_torchft_diloco_kill_and_heal(tmp_path):
    def launch(name, seed, port, log):
        env = {**os.environ, "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1", "PYTHONPATH": str(REPO)}
        return start([sys.executable, str(WORKER), "--replica-id", name, "--seed", str(seed), "--status-file", str(tmp_path / f"{name}.jsonl")],
                     log, env)
    kill_and_heal(tmp_path, launch, timeout=240)
