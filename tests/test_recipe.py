"""Recipe files end to end: `train --config` on the recipe of a demo run reproduces its training, and a GRPO recipe trains.

The recipe module's own checks (keys, values, paths, preflight) are lesson cells in nbs/27_recipe.ipynb; the staged commands
are in nbs/41_cli.ipynb. These two need the demo (a higher layer than the recipe module) or take longer.
"""
from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

from composer_replication.cli import main
from composer_replication.recipe import CHANNELS, load_recipe


def run_cli(*argv):
    with contextlib.redirect_stdout(io.StringIO()) as o, contextlib.redirect_stderr(io.StringIO()) as e:
        rc = main([str(a) for a in argv])
    return rc, o.getvalue(), e.getvalue()


def test_train_config_reproduces_a_demo_run(tmp_path):
    from composer_replication.demo import DemoConfig, run_demo
    cfg = DemoConfig(model="tiny", out=str(tmp_path), name="r", steps=2, max_seq_len=640, max_dpo_seq_len=320)
    run_demo(cfg, progress=False)
    run = tmp_path/"r"
    r = load_recipe(run/"recipe.yaml")     # the demo wrote it, beside the run's data
    assert (r.loss, r.collator["max_seq_len"], r.collator["max_dpo_seq_len"], r.training["max_steps"], r.train_layers) == (cfg.loss, 640, 320, 2, None)
    assert (r.data.states, r.data.pairs, r.model) == (str(run/"states.jsonl"), str(run/"pairs.jsonl"), "tiny")
    rc, out, err = run_cli("train", "--config", run/"recipe.yaml", "--quiet")
    assert rc == 0, err
    demo = [json.loads(l) for l in (run/"metrics.jsonl").read_text().splitlines()]
    again = [json.loads(l) for l in (run/"train"/"metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in demo] == [m["step"] for m in again] == [1, 2]
    for a, b in zip(demo, again):
        for k in CHANNELS["offline"]:
            assert math.isclose(a[k], b[k], rel_tol=1e-5, abs_tol=1e-6), (k, a, b)
    assert all(a[k] > 0 for a in again for k in CHANNELS["offline"])


REWARD = '''
def uses_tool(completions, **kw):
    "1 for a completion that calls a tool, plus a little for length (so the advantages are not all zero)."
    text = lambda c: c[0]["content"] if isinstance(c, list) else c
    return [float("<tool_call>" in text(c)) + 0.1 * len(text(c)) / 32 for c in completions]
'''


@pytest.mark.slow
def test_grpo_recipe_trains(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    from composer_replication.demo import SAMPLE_FIXES, SAMPLE_SESSION
    from composer_replication.ingestion.claude_code import ClaudeCodeIngester
    from composer_replication.jsonl import write_jsonl
    (tmp_path/"my_rewards.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    states = list(ClaudeCodeIngester().ingest(SAMPLE_SESSION))
    write_jsonl(tmp_path/"states.jsonl", states)
    pairs = [{"state_id": states[i]["state_id"], "state_messages": states[i]["messages"], "chosen": a,
              "rejected": states[i]["student_action"], "n_teachers_agreeing": 2} for i, a in SAMPLE_FIXES.items()]
    write_jsonl(tmp_path/"pairs.jsonl", pairs)
    write_jsonl(tmp_path/"prompts.jsonl", [{"prompt": [{"role": "user", "content": f"Run the tests of module {i}."}]} for i in range(8)])
    (tmp_path/"grpo.yaml").write_text(
        "mode: grpo\nmodel: tiny\noutput_dir: out\n"
        "data: {states: states.jsonl, pairs: pairs.jsonl, prompts: prompts.jsonl}\n"
        "grpo: {reward: 'my_rewards:uses_tool', trace_batch_size: 1}\n"
        "collator: {max_seq_len: 512, max_dpo_seq_len: 256}\n"
        "training: {max_steps: 2, per_device_train_batch_size: 4, num_generations: 4, max_completion_length: 8,\n"
        "           learning_rate: 1.0e-3, bf16: false, gradient_checkpointing: false, use_cpu: true}\n")
    rc, out, err = run_cli("train", "--config", tmp_path/"grpo.yaml")
    assert rc == 0, err
    assert "grpo" in out and "sdpo_jsd" in out and "trace_replay_dpo" in out
    rows = [json.loads(l) for l in (tmp_path/"out"/"metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rows] == [1, 2]
    for m in rows:
        assert all(math.isfinite(m[k]) for k in CHANNELS["grpo"]), m
        assert m["sdpo_jsd"] > 0 and m["trace_replay_dpo"] > 0, m
    assert json.loads((tmp_path/"out"/"summary.json").read_text())["mode"] == "grpo"
