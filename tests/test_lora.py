"""LoRA end to end through the command line: `train` with a recipe's lora: section writes an adapter folder, `eval --model` reads it
onto its base, and the merged model (`merge_and_unload`, saved as a plain folder) scores the same."""
import importlib.resources, json, os, subprocess, sys
from pathlib import Path

import pytest

pytest.importorskip("peft")


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _cli(*args):
    p = subprocess.run([sys.executable, "-m", "composer_replication", *map(str, args)], env=_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_train_lora_then_eval_the_adapter_folder(tmp_path):
    from composer_replication.ingestion.claude_code import ClaudeCodeIngester
    from composer_replication.jsonl import write_jsonl
    from composer_replication.models import is_adapter_folder, load_student
    from composer_replication.task_suite import make_task_suite
    sample = Path(importlib.resources.files("composer_replication"))/"assets/sample_session/demo-calc-fix.jsonl"
    write_jsonl(tmp_path/"states.jsonl", list(ClaudeCodeIngester().ingest(sample)))
    (tmp_path/"recipe.yaml").write_text("model: tiny\nlora: {r: 4, lora_alpha: 16}\ndata: {states: states.jsonl}\n"
                                        "collator: {max_seq_len: 1024}\ntraining: {max_steps: 3, learning_rate: 1.0e-2, use_cpu: true}\n")
    _cli("train", "--config", tmp_path/"recipe.yaml", "--out", tmp_path/"run", "--quiet")
    model_dir = tmp_path/"run"/"model"
    assert is_adapter_folder(model_dir) and not (model_dir/"model.safetensors").exists()
    assert json.loads((model_dir/"adapter_config.json").read_text())["base_model_name_or_path"] == "tiny"
    summ = json.loads((tmp_path/"run"/"summary.json").read_text())
    assert summ["trained"]["layers"].startswith("LoRA adapters (r=4") and summ["trained"]["trainable_params"] < summ["trained"]["params"] / 10
    # merging is one call: the merged model saved as an ordinary student folder
    peft_model, tok = load_student(model_dir)
    merged = peft_model.merge_and_unload()
    merged.save_pretrained(tmp_path/"merged"); tok.save_pretrained(tmp_path/"merged")
    make_task_suite(tmp_path/"suite", n_train=1, n_heldout=2, seed=0)
    split = tmp_path/"suite"/"heldout"
    scores = {}
    for name, model in (("adapters", model_dir), ("merged", tmp_path/"merged"), ("base", "tiny")):
        _cli("eval", split, split/"expected.jsonl", "--model", model, "--out", tmp_path/f"ev-{name}", "--no-greedy", "--first-call", "--quiet")
        recs = [json.loads(l) for l in (tmp_path/f"ev-{name}"/"records.jsonl").read_text().splitlines()]
        scores[name] = [r.get("margin_repeat") for r in recs]
    assert any(v is not None for v in scores["adapters"])
    for a, b in zip(scores["adapters"], scores["merged"], strict=True):
        assert (a is None) == (b is None) and (a is None or abs(a - b) < 1e-4), (a, b)
    assert scores["adapters"] != scores["base"]   # the adapters trained: the adapted student scores differently from its base


def test_chunked_losses_score_a_peft_model_like_its_merged_weights():
    "compose_loss / model_sequence_logprobs with chunk_size on a PeftModel read its final hidden states (not its logits)."
    import torch
    from composer_replication.loss import compose_loss, model_sequence_logprobs
    from composer_replication.models import add_lora, load_student
    torch.manual_seed(0)
    model, tok = load_student("tiny")
    pm = add_lora(model, {"r": 4, "lora_alpha": 8, "init_lora_weights": False})   # random B: the adapters change the outputs
    ids = torch.randint(3, 200, (2, 24)); mask = torch.ones_like(ids)
    batch = {"input_ids": ids, "response_mask": mask}
    with torch.no_grad():
        full = compose_loss(pm, batch, chunk_size=None).lm_ce
        chunked = compose_loss(pm, batch, chunk_size=8).lm_ce
        seq_full = model_sequence_logprobs(pm, ids, mask)
        seq_chunked = model_sequence_logprobs(pm, ids, mask, chunk_size=8)
        base = compose_loss(pm.get_base_model(), batch, chunk_size=8).lm_ce
    from composer_replication import checks   # by the module: a `test_` name imported here would be collected
    checks.test_close_ulps(full, chunked, ulps=16)            # a mean CE of ~7, summed in chunks: 16 float32 ulps
    checks.test_close_ulps(seq_full, seq_chunked, ulps=16)    # sums over 24 tokens (~-170), in another order
    checks.test_close_ulps(base, chunked)   # the adapted base is what a peft model computes: the same kernels, a few ulps
    with pm.disable_adapter(), torch.no_grad():
        off = compose_loss(pm, batch, chunk_size=8).lm_ce
    assert not torch.allclose(off, chunked, atol=1e-4)   # the adapters were in the chunked score
