"""Both trainers under DDP (2 CPU processes, gloo, launched by torchrun and by accelerate launch) against one process over the
same global batch: per-step channel losses and final trainable weights equal to 1e-5 (tests/ddp_worker.py runs each side)."""
import json, os, shutil, socket, subprocess, sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
WORKER = Path(__file__).with_name("ddp_worker.py")
TOL = 1e-5
BIN = Path(sys.executable).parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "MASTER_ADDR": "127.0.0.1"}


def _run(tmp, launcher, *args):
    "One training run; its rank-0 JSON."
    out = tmp/f"{launcher}-{len(list(tmp.iterdir()))}.json"
    if launcher == "one": cmd = [sys.executable, str(WORKER)]
    elif launcher == "torchrun": cmd = [str(BIN/"torchrun"), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(_port()), str(WORKER)]
    else: cmd = [str(BIN/"accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                 "--dynamo_backend", "no", "--main_process_ip", "127.0.0.1", "--main_process_port", str(_port()), str(WORKER)]
    p = subprocess.run([*cmd, *args, "--out", str(out)], env=_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text()), p.stdout


def _same(one, ddp):
    "Same logged steps, channels and trainable weights (to TOL)."
    assert (one["world"], ddp["world"]) == (1, 2)
    assert ddp["wrapped"] == "DistributedDataParallel" and one["wrapped"] != "DistributedDataParallel", (one["wrapped"], ddp["wrapped"])
    assert len(one["logs"]) == len(ddp["logs"]) == 3
    for s, (a, b) in enumerate(zip(one["logs"], ddp["logs"])):
        assert a.keys() == b.keys(), (a.keys(), b.keys())
        for k in a: assert abs(a[k] - b[k]) <= TOL * max(1.0, abs(a[k])), (s, k, a[k], b[k])
    assert one["weights"].keys() == ddp["weights"].keys()
    worst = max(abs(u - v) for n in one["weights"] for u, v in zip(one["weights"][n], ddp["weights"][n]))
    assert worst <= TOL, worst


def _active(res, *chans):
    "Every channel in `chans` is non-zero at some step (the comparison is not between zeros)."
    for c in chans: assert any(l[f"composer/{c}"] != 0 for l in res["logs"]), (c, res["logs"])


def test_offline_three_channels_torchrun(tmp_path):
    one, _ = _run(tmp_path, "one", "--trainer", "offline", "--batch", "4")
    ddp, stdout = _run(tmp_path, "torchrun", "--trainer", "offline", "--batch", "2")
    _active(one, "lm_ce", "sdpo_jsd", "trace_replay_dpo")
    _same(one, ddp)
    assert stdout.count("'train_runtime'") == 1   # only rank 0 prints the trainer's logs


def test_offline_lora_chunked_accumulated_torchrun(tmp_path):
    "LoRA adapters (reference = adapters disabled), the chunked losses, 2 accumulation steps: normalised over the whole step."
    one, _ = _run(tmp_path, "one", "--trainer", "offline", "--batch", "4", "--ga", "2", "--lora", "--chunk", "64")
    ddp, _ = _run(tmp_path, "torchrun", "--trainer", "offline", "--batch", "2", "--ga", "2", "--lora", "--chunk", "64")
    assert one["reference"] == ddp["reference"] == "adapters disabled"
    assert one["fused_lora_layers"] == ddp["fused_lora_layers"] == 6   # add_lora's layers (2 layers x q, v, up) under DDP too
    assert one["weights"] and all("lora_" in n for n in one["weights"])   # the adapters alone train
    _active(one, "lm_ce", "sdpo_jsd", "trace_replay_dpo")
    _same(one, ddp)


def test_grpo_torchrun(tmp_path):
    one, _ = _run(tmp_path, "one", "--trainer", "grpo", "--batch", "4")
    ddp, _ = _run(tmp_path, "torchrun", "--trainer", "grpo", "--batch", "2")
    _active(one, "grpo", "sdpo_jsd", "trace_replay_dpo")
    _same(one, ddp)


@pytest.mark.skipif(shutil.which("accelerate", path=str(BIN)) is None, reason="accelerate's launcher is not installed")
def test_grpo_lora_accelerate_launch(tmp_path):
    one, _ = _run(tmp_path, "one", "--trainer", "grpo", "--batch", "4", "--lora")
    ddp, _ = _run(tmp_path, "accelerate", "--trainer", "grpo", "--batch", "2", "--lora")
    assert one["reference"] == "adapters disabled" and one["fused_lora_layers"] == ddp["fused_lora_layers"] == 6
    _active(one, "sdpo_jsd", "trace_replay_dpo")
    _same(one, ddp)


def _cli_recipe(tmp, batch):
    "A LoRA recipe on the tiny model and the sample session (its 6 windows at 1,024 tokens), in order."
    import importlib.resources
    from composer_replication.ingestion.claude_code import ClaudeCodeIngester
    from composer_replication.jsonl import write_jsonl
    sample = Path(importlib.resources.files("composer_replication"))/"assets/sample_session/demo-calc-fix.jsonl"
    states = list(ClaudeCodeIngester().ingest(sample))
    write_jsonl(tmp/"states.jsonl", states)
    fixes = {2: '[TOOL_USE] name=Read input={"file_path": "/home/user/calc/calc/core.py"}', 6: '[TOOL_USE] name=Read input={"file_path": "/home/user/calc/tests/test_calc.py"}'}
    write_jsonl(tmp/"pairs.jsonl", [{"state_id": states[i]["state_id"], "state_messages": states[i]["messages"], "chosen": a,
                                     "rejected": states[i]["student_action"], "n_teachers_agreeing": 2} for i, a in fixes.items()])
    cfg = tmp/f"recipe-{batch}.yaml"
    cfg.write_text("model: tiny\nlora:\n  r: 4\n  lora_alpha: 8\ndata:\n  states: states.jsonl\n  pairs: pairs.jsonl\n"
                   "collator:\n  max_seq_len: 1024\n  max_dpo_seq_len: 512\nloss:\n  alpha_sdpo: 0.5\n  beta_replay: 0.5\n"
                   f"training:\n  max_steps: 3\n  learning_rate: 1.0e-2\n  per_device_train_batch_size: {batch}\n"
                   "  train_sampling_strategy: sequential\n  use_cpu: true\n")
    return cfg


def test_cli_train_torchrun_module_rank0_outputs(tmp_path):
    "`torchrun -m composer_replication train`: one summary line, one set of files, the same metrics as one process (point 3 of issue 25)."
    one = subprocess.run([sys.executable, "-m", "composer_replication", "train", "--config", str(_cli_recipe(tmp_path, 2)), "--out",
                          str(tmp_path/"one"), "--quiet"], env=_env(), capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    ddp = subprocess.run([str(BIN/"torchrun"), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(_port()),
                          "-m", "composer_replication", "train", "--config", str(_cli_recipe(tmp_path, 1)), "--out", str(tmp_path/"ddp")],
                         env=_env(), capture_output=True, text=True, timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert ddp.stdout.count("trained 3 steps") == 1 and "on 2 processes" in ddp.stdout, ddp.stdout   # rank 0 prints, once
    assert ddp.stdout.count("wrote ") == 1 and ddp.stderr.count("train:") >= 1
    files = sorted(p.name for p in (tmp_path/"ddp").iterdir())
    assert files == ["metrics.jsonl", "model", "recipe.yaml", "summary.json"], files
    assert (tmp_path/"ddp"/"model"/"adapter_config.json").is_file() and not (tmp_path/"ddp"/"model"/"model.safetensors").exists()
    s = json.loads((tmp_path/"ddp"/"summary.json").read_text()); assert s["processes"] == 2 and s["steps"] == 3
    rows = lambda d: [json.loads(l) for l in (tmp_path/d/"metrics.jsonl").read_text().splitlines()]
    a, b = rows("one"), rows("ddp")
    assert len(a) == len(b) == 3
    for x, y in zip(a, b):
        for k in ("lm_ce", "sdpo_jsd", "trace_replay_dpo", "loss"): assert abs(x[k] - y[k]) <= TOL * max(1.0, abs(x[k])), (k, x, y)
    assert any(x["trace_replay_dpo"] != 0 for x in a) and any(x["sdpo_jsd"] != 0 for x in a)
    from safetensors.torch import load_file
    wa, wb = (load_file(str(tmp_path/d/"model"/"adapter_model.safetensors")) for d in ("one", "ddp"))
    assert wa.keys() == wb.keys() and wa
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) <= TOL
    assert any(float(wa[k].abs().max()) > 0 for k in wa if "lora_B" in k)   # the adapters trained (B starts at 0)


@pytest.mark.parametrize("chunk", [None, 64])
def test_loss_path_under_fsdp2_on_cpu(tmp_path, chunk):
    """torch's FSDP2 (fully_shard: each decoder layer, then the root) on 2 CPU processes: the loss run as the root's forward sees the
    gathered LM head (chunked too); channels and weights equal one process's (tests/fsdp_worker.py; accelerate itself does not shard on CPUs)."""
    extra = [] if chunk is None else ["--chunk", str(chunk)]
    one_out, ddp_out = tmp_path/"one.json", tmp_path/"fsdp.json"
    for cmd, out in (([sys.executable], one_out),
                     ([str(BIN/"torchrun"), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(_port())], ddp_out)):
        p = subprocess.run([*cmd, str(WORKER.with_name("fsdp_worker.py")), "--out", str(out), *extra], env=_env(), capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
    one, sh = json.loads(one_out.read_text()), json.loads(ddp_out.read_text())
    assert (one["world"], sh["world"], sh["sharded"]) == (1, 2, True)   # the parameters really were sharded (DTensors)
    for a, b in zip(one["logs"], sh["logs"], strict=True):
        for x, y in zip(a, b): assert abs(x - y) <= TOL * max(1.0, abs(x)), (a, b)
    assert all(v != 0 for v in one["logs"][0])   # all three channels active
    worst = max(abs(u - v) for n in one["weights"] for u, v in zip(one["weights"][n], sh["weights"][n], strict=True))
    assert worst <= TOL, worst


def test_demo_recipe_torchrun_on_cpus(tmp_path):
    """Issue 35.5: the recipe exactly as `demo` writes it (no use_cpu) under torchrun on CPUs trains data-parallel (gloo): one summary
    line, one set of files, `processes: 2`, and the metrics and weights of one process at twice the per-device batch."""
    demo = subprocess.run([sys.executable, "-m", "composer_replication", "demo", "--model", "tiny", "--steps", "3", "--max-seq-len", "1024",
                           "--out", str(tmp_path), "--name", "d", "--quiet"], env=_env(), capture_output=True, text=True, timeout=600)
    assert demo.returncode == 0, demo.stderr[-3000:]
    cfg = tmp_path/"d"/"recipe.yaml"
    text = cfg.read_text()
    assert "use_cpu" not in text and "  per_device_train_batch_size: 1\n" in text, text
    (tmp_path/"d"/"recipe-b2.yaml").write_text(text.replace("  per_device_train_batch_size: 1\n", "  per_device_train_batch_size: 2\n"))
    one = subprocess.run([sys.executable, "-m", "composer_replication", "train", "--config", str(tmp_path/"d"/"recipe-b2.yaml"), "--out",
                          str(tmp_path/"one"), "--quiet"], env=_env(), capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                          str(_port()), "-m", "composer_replication", "train", "--config", str(cfg), "--out", str(tmp_path/"ddp")],
                         env=_env(), capture_output=True, text=True, timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert ddp.stdout.count("trained 3 steps") == 1 and "on 2 processes" in ddp.stdout and ddp.stdout.count("wrote ") == 1, ddp.stdout
    assert "parallel_mode != ParallelMode.DISTRIBUTED" not in ddp.stderr, ddp.stderr[-3000:]
    files = sorted(p.name for p in (tmp_path/"ddp").iterdir())
    assert files == ["metrics.jsonl", "model", "recipe.yaml", "summary.json"], files
    s = json.loads((tmp_path/"ddp"/"summary.json").read_text()); assert (s["processes"], s["steps"]) == (2, 3), s
    assert json.loads((tmp_path/"one"/"summary.json").read_text())["processes"] == 1
    rows = lambda d: [json.loads(l) for l in (tmp_path/d/"metrics.jsonl").read_text().splitlines()]
    a, b = rows("one"), rows("ddp")
    assert len(a) == len(b) == 3
    for x, y in zip(a, b):
        for k in ("lm_ce", "sdpo_jsd", "trace_replay_dpo", "loss"): assert abs(x[k] - y[k]) <= TOL * max(1.0, abs(x[k])), (k, x, y)
    assert all(any(x[k] != 0 for x in a) for k in ("lm_ce", "sdpo_jsd", "trace_replay_dpo"))   # every channel trains at some step
    from safetensors.torch import load_file
    wa, wb = (load_file(str(tmp_path/d/"model"/"model.safetensors")) for d in ("one", "ddp"))
    assert wa.keys() == wb.keys() and wa
    # Adam moves a weight whose gradient is near its eps by a share of lr (the demo's 3e-3) that rounding decides: measured 2.2e-5
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) <= 1e-4
