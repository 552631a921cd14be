"""The three-channel trainer (`ComposerOfflineTrainer`, built from a replica spec by `train_composer_replica`) under DiLoCo
across processes, which no notebook cell can host:

* two replicas started by `LocalProcessExecutor` meet through `ObjectStoreAllReduce` on file://; with outer SGD lr 1 and no
  momentum they end one round bit-identical to each other and equal to the average of two independent local runs;
* with the paper's outer settings (Nesterov SGD, lr 0.7, momentum 0.9), two replicas on the same data follow the
  single-replica loss curve (tolerance 1e-5; identical data and init make the pseudo-gradients equal);
* resuming a replica from a checkpoint restores the outer state, the manager's step and the store's round;
* under a real torchft Lighthouse with two replica groups, the trainer keeps training when one group is killed, and a
  rejoining group with other initial weights heals from its peer.
Everything started is stopped; servers bind 127.0.0.1 only."""
import json, os, sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchft")
pytest.importorskip("transformers")
from composer_replication.diloco.serverless import LocalProcessExecutor, MockManager, ObjectStoreAllReduce
from composer_replication.diloco.serverless.replica_entrypoint import train_composer_replica

sys.path.insert(0, str(Path(__file__).parent))
from torchft_helpers import LIGHTHOUSE, REPO, free_port, kill_and_heal, start  # noqa: E402

ENTRY = "composer_replication.diloco.serverless.replica_entrypoint"
FIXES = {"2": '[TOOL_USE] name=Edit input={"file_path": "/home/user/calc/calc/core.py", "new_string": "    return a + b", "old_string": "    return a - b"}',
         "6": '[TOOL_USE] name=Read input={"file_path": "/home/user/calc/tests/test_calc.py"}'}


def spec(out, **diloco):
    "A short three-channel run of the tiny model on the sample session, one example per assistant turn."
    return {"pairs": FIXES, "examples": "turn", "loss_config": {"alpha_sdpo": 0.5, "beta_replay": 0.5},
            "collator": {"max_seq_len": 192, "max_dpo_seq_len": 192},
            "training_args": {"max_steps": 3, "learning_rate": 3e-3, "output_dir": str(out)},
            "diloco": {"sync_every": 3, "use_bucketization": True, **diloco}}


def launch(tmp_path, name, s, world_size=2, timeout=3600):
    "Run `world_size` replicas of `train_composer_replica` through LocalProcessExecutor; return their results in rank order."
    ex = LocalProcessExecutor()
    hs = ex.launch_replicas(world_size, ENTRY, {"rendezvous_uri": f"file://{tmp_path}/{name}", "world_size": world_size,
                                                "trainer_module": ENTRY, "trainer_fn": "train_composer_replica",
                                                "trainer_kwargs": {"spec": s, "return_params": True},
                                                "store_kwargs": {"poll_interval_s": 0.05, "timeout_s": timeout}}, timeout=timeout)
    res = ex.collect(hs, timeout=timeout)
    assert [r["status"] for r in res] == ["succeeded"] * world_size, [(r["status"], r["error"]) for r in res]
    return [r["result"] for r in res]


@pytest.mark.slow
def test_two_replicas_one_round_is_the_average_of_local_runs(tmp_path):
    s = spec(tmp_path / "out", outer_lr=1.0, outer_momentum=0.0)
    a, b = launch(tmp_path, "rdv", s)
    assert a["sync_steps"] == b["sync_steps"] == [3]
    assert a["final_digest"] == b["final_digest"]  # bit-identical after the round
    assert a["losses"] != b["losses"]  # each replica trained its own shard
    local = [train_composer_replica(None, k, 2, spec={**s, "diloco": None}, return_params=True) for k in range(2)]
    assert local[0]["losses"] == a["losses"] and local[1]["losses"] == b["losses"]  # the same inner steps as in the replicas
    assert not torch.allclose(local[0]["params"]["lm_head.weight"], local[1]["params"]["lm_head.weight"])
    worst = 0.0
    for n, p in a["params"].items():
        avg = (local[0]["params"][n].double() + local[1]["params"][n].double()) / 2
        worst = max(worst, (p.double() - avg).abs().max().item())
    assert worst < 1e-6, worst
    # one fp32 copy of the model per sync and replica, plus the safetensors header
    assert 0 < a["bytes_written"] - 4 * a["n_params"] < 2000 and a["bytes_read"] == b["bytes_written"]


@pytest.mark.slow
def test_two_replicas_on_the_same_data_follow_the_single_replica_curve(tmp_path):
    s = spec(tmp_path / "out")  # the paper's outer optimizer: Nesterov SGD, lr 0.7, momentum 0.9
    s = {**s, "shard": False, "training_args": {**s["training_args"], "max_steps": 6}}
    a, b = launch(tmp_path, "rdv", s)
    one = train_composer_replica(MockManager(ObjectStoreAllReduce(tmp_path / "one", 0, 1)), 0, 1, spec=s)
    plain = train_composer_replica(None, 0, 1, spec={**s, "diloco": None})
    assert a["sync_steps"] == one["sync_steps"] == [3, 6]
    gap = max(abs(x - y) for r in (a, b) for x, y in zip(r["losses"], one["losses"]))
    assert gap <= 1e-5, gap  # the stated tolerance
    assert a["final_digest"] == b["final_digest"]
    # the comparison can tell curves apart: after the first outer step DiLoCo leaves plain training's curve
    assert max(abs(x - y) for x, y in zip(one["losses"][3:], plain["losses"][3:])) > 1e-4


def test_resume_restores_outer_state_manager_step_and_store_round(tmp_path):
    s = spec(tmp_path / "out", sync_every=2)
    s["training_args"].update(max_steps=4, save_strategy="steps", save_steps=1)
    s["diloco"]["use_bucketization"] = False  # 21 all-reduce rounds per sync: the store round matters
    m = MockManager(ObjectStoreAllReduce(tmp_path / "full", 0, 1))
    full = train_composer_replica(m, 0, 1, spec=s)
    ckpt = tmp_path / "out" / "replica-0" / "checkpoint-3"
    state = torch.load(ckpt / "diloco_state.pt", weights_only=True)
    assert (state["local_step"], state["manager_step"], state["store_round"]) == (1, 1, 21)
    m2 = MockManager(ObjectStoreAllReduce(tmp_path / "resumed", 0, 1))
    res = train_composer_replica(m2, 0, 1, spec={**s, "resume_from_checkpoint": str(ckpt)})
    assert (m2.current_step(), m2.store.round_id) == (m.current_step(), m.store.round_id) == (2, 42)
    assert res["final_digest"] == full["final_digest"]


# ---------------------------------------------------------------- torchft: a Lighthouse and two replica groups

@pytest.mark.slow
@pytest.mark.skipif(not LIGHTHOUSE.exists(), reason="torchft_lighthouse binary not found next to the interpreter")
def test_torchft_trainer_kill_and_heal(tmp_path):
    def launch(name, seed, port, log):
        s = spec(tmp_path / "out" / name, sync_every=4, outer_lr=0.7, outer_momentum=0.9)
        s.update(model_seed=seed, shard=False)
        s["training_args"]["max_steps"] = 100_000  # stopped by the scenario
        env = {**os.environ, "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}", "MASTER_PORT": str(free_port()), "PYTHONPATH": str(REPO)}
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"): env.pop(k, None)
        return start([sys.executable, "-m", ENTRY, "torchft", "--replica-id", name, "--spec-json", json.dumps(s),
                      "--status-file", str(tmp_path / f"{name}.jsonl")], log, env)
    a_events = kill_and_heal(tmp_path, launch, timeout=300)
    losses = [e["composer/total"] for e in a_events if e["event"] == "step"]
    assert len(losses) > 8 and all(x == x for x in losses)  # a kept training through the kill and the heal (finite losses)
