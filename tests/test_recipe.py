"""Recipe files end to end: `train --config` on the recipe of a demo run reproduces its training, and a GRPO recipe trains.

The recipe modules' own checks are lesson cells: values in nbs/27a_recipe_checks.ipynb, keys and paths in nbs/27b_recipe.ipynb,
the preflight in nbs/27c_recipe_build.ipynb; the staged commands are in nbs/tutorials/staged_workflow.ipynb. These two need
the demo (a higher layer than the recipe modules) or take longer.
"""
from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

from composer_replication.cli import main
from composer_replication.recipe import load_recipe
from composer_replication.recipe_build import CHANNELS


def run_cli(*argv):
    with contextlib.redirect_stdout(io.StringIO()) as o, contextlib.redirect_stderr(io.StringIO()) as e:
        rc = main([str(a) for a in argv])
    return rc, o.getvalue(), e.getvalue()


def test_train_config_reproduces_a_demo_run(tmp_path):
    from composer_replication.demo import run_demo
    from composer_replication.demo_config import DemoConfig
    cfg = DemoConfig(model="tiny", out=str(tmp_path), name="r", steps=2, max_seq_len=3072, max_dpo_seq_len=512)   # the session fits one row: every channel every step
    run_demo(cfg, progress=False)
    run = tmp_path/"r"
    r = load_recipe(run/"recipe.yaml")     # the demo wrote it, beside the run's data
    assert (r.loss, r.collator["max_seq_len"], r.collator["max_dpo_seq_len"], r.training["max_steps"], r.train_layers) == (cfg.loss, 3072, 512, 2, None)
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
    from composer_replication.sample import SAMPLE_FIXES, SAMPLE_SESSION
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
        "collator: {max_seq_len: 3072, max_dpo_seq_len: 512}\n"   # the session in one row: both trace channels every step
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
    # the builder scores the trace batches' DPO reference once per row, as the GRPO trainer itself would at every step
    import torch
    from composer_replication.recipe_build import build_trainer
    tr, _ = build_trainer(load_recipe(tmp_path/"grpo.yaml"))
    assert tr.reference == "frozen copy" and type(tr.trace_collator).__name__ == "_ScoredCollator", tr.trace_collator
    rows = tr.trace_dataset[:1] * 2
    got, own = tr.trace_collator(rows), tr._with_ref_logprobs(tr.recipe_collator(rows))
    for k in ("dpo_chosen_ref_logprobs", "dpo_rejected_ref_logprobs"):
        assert torch.allclose(got[k], own[k], rtol=1e-5, atol=1e-3), (k, got[k], own[k])


# Issue 22 point 6: every recipe value is checked (type and range) before anything loads; hostile YAML is one line, fast.
BAD_VALUES = {
    "training: {max_steps: ten}": "training.max_steps: must be an int, got 'ten'",
    "training: {max_steps: -5}": "training.max_steps: must be an int >= 1 (or -1",
    "training: {max_steps: 0}": "training.max_steps: must be an int >= 1",
    "training: {max_steps: 2.5}": "training.max_steps: must be an int, got 2.5",
    "training: {learning_rate: .nan}": "training.learning_rate: must be a finite number, got nan",
    "training: {learning_rate: -0.1}": "training.learning_rate: must be in (0, inf), got -0.1",
    "training: {per_device_train_batch_size: 0}": "training.per_device_train_batch_size: must be in [1, inf), got 0",
    "training: {gradient_accumulation_steps: true}": "training.gradient_accumulation_steps: must be an int, got True",
    "training: {weight_decay: .inf}": "training.weight_decay: must be a finite number, got inf",
    "training: {adam_beta2: 1.0}": "training.adam_beta2: must be in [0, 1), got 1.0",
    "training: {logging_steps: 0}": "training.logging_steps: must be in (0, inf), got 0",
    "training: {report_to: 5}": "training.report_to: must be a string or a list of strings or null, got 5",
    "training: {lr_scheduler_type: [cosine]}": "training.lr_scheduler_type: must be one of 'linear'",
    "loss: {alpha_sdpo: -1}": "loss.alpha_sdpo: must be in [0, inf), got -1",
    "loss: {beta_replay: ten}": "loss.beta_replay: must be a real number",
    "collator: {max_seq_len: 0}": "collator.max_seq_len: must be an int >= 2",
    "collator: {max_seq_len: true}": "collator.max_seq_len: must be an int, got True",
    "data: {repeat: 0}": "data.repeat: must be >= 1",
    "seed: 1.5": "seed: must be an int",
    "output_dir: ~nosuchuser12345/out": "output_dir: '~nosuchuser12345/out' starts with ~ but names no user",
}


@pytest.mark.parametrize("text", list(BAD_VALUES))
def test_bad_values_are_one_line_naming_the_key(text):
    from composer_replication.recipe import RecipeError, parse_recipe
    with pytest.raises(RecipeError) as e: parse_recipe(text, source="r.yaml")
    msg = str(e.value)
    assert msg.startswith("r.yaml: ") and BAD_VALUES[text] in msg and "\n" not in msg, msg


def test_hostile_yaml_is_refused_fast_and_short(tmp_path):
    import time
    from composer_replication.recipe import RecipeError, load_recipe, parse_recipe
    bomb = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    bomb += "".join(f"# padding to the issue's 744 bytes {i:03d}\n" for i in range(9))
    (tmp_path / "bomb.yaml").write_text(bomb); assert 700 < len(bomb.encode()) < 800
    t0 = time.perf_counter()
    with pytest.raises(RecipeError, match="more than 100,000 values once its aliases"): load_recipe(tmp_path / "bomb.yaml")
    for text in ("[" * 10_000, "training: " + "{a: " * 10_000, "- " * 10_000 + "x"):
        with pytest.raises(RecipeError, match="nested more than 64 levels deep"): parse_recipe(text)
    assert time.perf_counter() - t0 < 10
    for text in ("training: {learning_rate: '" + "9" * 1_000_000 + "'}", "name: [" + "1, " * 200_000 + "1]", "'" + "k" * 100_000 + "': 1"):
        with pytest.raises(RecipeError) as e: parse_recipe(text)
        assert len(str(e.value)) <= 700, len(str(e.value))


def test_output_dir_paths(tmp_path, monkeypatch):
    import dataclasses
    from composer_replication.recipe import Recipe, DataSpec, RecipeError, parse_recipe
    from composer_replication.recipe_build import check_recipe
    states = tmp_path / "states.jsonl"; states.write_text("{}\n")
    ok = Recipe(data=DataSpec(states=str(states)), output_dir=str(tmp_path / "out"))
    assert check_recipe(ok) is ok
    for out, msg in ((states / "sub" / "out", f"cannot be made: {states} is a file, not a folder"), (states, "exists and is not a folder")):
        with pytest.raises(RecipeError, match="output_dir: ") as e: check_recipe(dataclasses.replace(ok, output_dir=str(out)))
        assert msg in str(e.value)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    r = parse_recipe("output_dir: ~/runs/a\ndata: {states: ~/s.jsonl}", base_dir=tmp_path / "elsewhere")
    assert (r.output_dir, r.data.states) == (str(tmp_path / "home" / "runs" / "a"), str(tmp_path / "home" / "s.jsonl"))


ENV = '''
class Counter:
    "A user's environment: one tool, and the reward is whether it was called with the prompt's number."
    def reset(self, target=None, **row): self.target, self.hits = target, 0
    def add(self, n: int) -> str:
        """Add n to the counter.

        Args:
            n: how much to add
        """
        self.hits += int(n == self.target)
        return f"added {n}"
    def get_reward(self) -> float: return float(self.hits > 0)
'''

@pytest.mark.slow
def test_grpo_recipe_with_a_users_environment(tmp_path, monkeypatch):
    "grpo.environment names a user's TRL environment_factory by module:attr; its prompts are data.prompts, its reward get_reward()."
    pytest.importorskip("trl")
    from composer_replication.on_policy import OnPolicyComposerTrainer
    from composer_replication.jsonl import write_jsonl
    from composer_replication.recipe_build import build_trainer
    (tmp_path/"my_env.py").write_text(ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    write_jsonl(tmp_path/"prompts.jsonl", [{"prompt": [{"role": "user", "content": f"Add {i} to the counter."}], "target": i} for i in range(4)])
    (tmp_path/"env.yaml").write_text(
        "mode: grpo\nmodel: tiny\noutput_dir: out\ndata: {prompts: prompts.jsonl}\ngrpo: {environment: 'my_env:Counter'}\n"
        "training: {max_steps: 2, per_device_train_batch_size: 4, num_generations: 2, max_completion_length: 16,\n"
        "           max_tool_calling_iterations: 1, use_cpu: true}\n")
    tr, _ = build_trainer(load_recipe(tmp_path/"env.yaml"))
    assert type(tr) is OnPolicyComposerTrainer, type(tr)
    rc, out, err = run_cli("train", "--config", tmp_path/"env.yaml", "--quiet")
    assert rc == 0, err
    rows = [json.loads(l) for l in (tmp_path/"out"/"metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["reward"]) and math.isfinite(r["grpo"]) for r in rows), rows
    (tmp_path/"bad.yaml").write_text((tmp_path/"env.yaml").read_text().replace("my_env:Counter", "my_env:Countr"))
    rc, out, err = run_cli("train", "--config", tmp_path/"bad.yaml")
    assert rc == 2 and "grpo.environment 'my_env:Countr': 'my_env' has no attribute 'Countr' (did you mean 'Counter'?)" in err, err


@pytest.mark.parametrize("change, needles", [
    ({"report_to": "neptune2"}, ["training.report_to: unknown tracker 'neptune2'", "the known trackers are all, azure_ml,", "neptune, none,"]),
    ({"pairs": "empty.jsonl"}, ["data.pairs: ", "empty.jsonl holds no DPO pair", "loss.beta_replay: 0.5"]),
    ({"pairs": "blank.jsonl"}, ["data.pairs: ", "blank.jsonl holds no DPO pair"]),   # lines, but no pair among them
    ({"states": "empty.jsonl"}, ["data.states: ", "empty.jsonl holds no TraceState"]),
])
def test_preflight_refuses_before_the_model_loads(tmp_path, monkeypatch, change, needles):
    "Issue 35.4: an unknown tracker, or an empty file for a channel with weight > 0, is exit 2 naming the key (and the file), nothing loaded or written."
    from composer_replication import recipe_build
    from composer_replication.sample import SAMPLE_SESSION
    from composer_replication.ingestion.claude_code import ClaudeCodeIngester
    from composer_replication.jsonl import write_jsonl
    write_jsonl(tmp_path/"states.jsonl", list(ClaudeCodeIngester().ingest(SAMPLE_SESSION)))
    (tmp_path/"empty.jsonl").write_text(""); (tmp_path/"blank.jsonl").write_text("\n\nnot json\n[1, 2]\n{\"state_id\": \"x\"}\n")
    d = {"states": "states.jsonl", "pairs": "empty.jsonl", "report_to": "none", **change}
    if "pairs" not in change: d["pairs"] = None
    (tmp_path/"r.yaml").write_text(f"model: tiny\noutput_dir: out\ndata: {{states: {d['states']}, pairs: {d['pairs'] or 'null'}}}\n"
                                   f"loss: {{beta_replay: 0.5}}\ntraining: {{max_steps: 1, report_to: {d['report_to']}}}\n")
    def loads(*a, **k): raise AssertionError("the model was loaded")
    monkeypatch.setattr(recipe_build, "load_recipe_model", loads)
    rc, out, err = run_cli("train", "--config", tmp_path/"r.yaml")
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), (rc, err)
    for n in needles: assert n in err, (n, err)
    assert not (tmp_path/"out").exists()


def test_empty_pairs_pass_when_the_dpo_channel_is_off(tmp_path):
    from composer_replication.recipe import load_recipe
    from composer_replication.recipe_build import check_recipe
    (tmp_path/"states.jsonl").write_text("{}\n"); (tmp_path/"pairs.jsonl").write_text("")
    for loss in ("{beta_replay: 0}", "{beta_replay: 0.5}\ncollator: {enable_replay_dpo: false}"):
        (tmp_path/"r.yaml").write_text(f"data: {{states: states.jsonl, pairs: pairs.jsonl}}\nloss: {loss}\n")
        r = load_recipe(tmp_path/"r.yaml"); assert check_recipe(r) is r


def test_a_cpu_launch_refuses_use_cpu_false(tmp_path, monkeypatch):
    "Issue 35.5: 2 processes on CPUs with use_cpu: false would train two copies: exit 2 before training, one line."
    from composer_replication import recipe_build
    monkeypatch.setattr(recipe_build, "_accelerator", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "2"); monkeypatch.setenv("LOCAL_RANK", "0")   # what torchrun sets (rank 0's launch)
    (tmp_path/"states.jsonl").write_text("{}\n")
    (tmp_path/"r.yaml").write_text("data: {states: states.jsonl}\ntraining: {use_cpu: false}\n")
    rc, out, err = run_cli("train", "--config", tmp_path/"r.yaml")
    assert rc == 2 and len(err.splitlines()) == 1, (rc, err)
    assert "training.use_cpu: is false, but this launch has 2 processes and no accelerator" in err, err


def test_a_diloco_replicas_world_size_is_not_a_launch(monkeypatch):
    "A DiLoCo replica (HF Jobs, Modal) has WORLD_SIZE = its replicas but no launcher's LOCAL_RANK: its arguments stay one process's."
    from composer_replication import recipe_build
    from composer_replication.recipe import Recipe
    monkeypatch.setattr(recipe_build, "_accelerator", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "4"); monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert recipe_build._launch_size() == 1
    a = recipe_build._args(Recipe(training={"max_steps": 1}))
    assert not a.use_cpu and a.world_size == 1


def test_a_demo_with_no_pairs_writes_a_recipe_that_trains(tmp_path):
    "A demo whose replay mined 0 pairs (a $0 budget) writes data.pairs: null, so `train --config` on its recipe passes the preflight."
    from composer_replication.demo import run_demo
    from composer_replication.demo_config import DemoConfig
    from composer_replication.recipe_build import check_recipe
    s = run_demo(DemoConfig(out=str(tmp_path), name="broke", steps=1, model="tiny", max_total_usd=0), progress=False)
    assert s["pairs"] == 0 and (tmp_path/"broke"/"pairs.jsonl").exists()
    r = load_recipe(tmp_path/"broke"/"recipe.yaml")
    assert r.data.pairs is None and r.data.states == str(tmp_path/"broke"/"states.jsonl")
    assert check_recipe(r) is r
