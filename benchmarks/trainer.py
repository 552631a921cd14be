"""Time per optimizer step of the three-channel GRPO trainer, next to plain GRPO and to the channels run alone.

    python benchmarks/trainer.py [--steps 6] [--warmup 2]

Each configuration runs in its own subprocess (torch.set_num_threads(2), the tiny Llama, the project
tokenizer, the sample session's traces with its error sites and two DPO pairs):

  three_channel  ComposerReplicationTrainer: GRPO + alpha*SDPO + beta*DPO in one optimizer step
  grpo           trl.GRPOTrainer alone, same GRPO settings (fp32 and no gradient checkpointing for all: GRPOConfig
                 defaults to bf16 autocast and checkpointing, which on a CPU only slow every channel down)
  sdpo_alone     an AdamW step on the SDPO channel alone (same trace batches)
  dpo_alone      an AdamW step on the DPO channel alone (reference log-probs included)

It prints the mean seconds per step and the ratios three_channel / grpo and three_channel / (sum of the
three channels alone), and writes benchmarks/results/trainer.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("three_channel", "grpo", "sdpo_alone", "dpo_alone")
PAIR_FIXES = {2: '[TOOL_USE] name=Edit input={"file_path": "/home/user/calc/calc/core.py", "new_string": "    return a + b", "old_string": "    return a - b"}',
              6: '[TOOL_USE] name=Read input={"file_path": "/home/user/calc/tests/test_calc.py"}'}


def _setup(tok=None, max_seq_len=1024, max_dpo_seq_len=512):
    "(tokenizer, trace examples with two DPO pairs, collator) from the sample session; `tok` defaults to the project's tiny one."
    import importlib.resources
    import torch
    from composer_replication.hint_generator import dispatch
    from composer_replication.ingestion.claude_code import ClaudeCodeIngester
    from composer_replication.tiny import tiny_tokenizer
    from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator, trace_examples_from_states
    torch.set_num_threads(2)
    tok = tok or tiny_tokenizer()
    sample = Path(importlib.resources.files("composer_replication")) / "assets/sample_session/demo-calc-fix.jsonl"
    states = list(ClaudeCodeIngester().ingest(sample))
    pairs = [{"state_id": states[i]["state_id"], "state_messages": states[i]["messages"], "chosen": a,
              "rejected": states[i]["student_action"], "n_teachers_agreeing": 3} for i, a in PAIR_FIXES.items()]
    examples = trace_examples_from_states(states, pairs=pairs)
    collator = ComposerDataCollator(tok, CollatorConfig(pad_token_id=tok.pad_token_id, hint_generator=dispatch,
                                                        max_seq_len=max_seq_len, max_dpo_seq_len=max_dpo_seq_len))
    return tok, examples, collator


def worker(cfg: str, steps: int, warmup: int) -> dict:
    import logging
    import tempfile
    import warnings
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from composer_replication.tiny import tiny_causal_lm
    from composer_replication.trainer.composer_trainer import ComposerReplicationTrainer
    from composer_replication.loss import replay_channel_loss, sdpo_channel_loss
    from composer_replication.trainer.data_collator import precompute_ref_logprobs
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    tok, examples, collator = _setup()
    model = tiny_causal_lm(seed=0)
    times: list[float] = []

    if cfg in ("sdpo_alone", "dpo_alone"):
        import copy
        ref = copy.deepcopy(model).eval()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = collator(examples)
        for i in range(warmup + steps):
            t = time.perf_counter()
            opt.zero_grad()
            if cfg == "sdpo_alone":
                loss = sdpo_channel_loss(model, batch)
            else:
                b = precompute_ref_logprobs(ref, {k: v for k, v in batch.items() if not k.endswith("_ref_logprobs")})
                loss = replay_channel_loss(model, b)
            loss.backward()
            opt.step()
            if i >= warmup:
                times.append(time.perf_counter() - t)
        return {"config": cfg, "step_s": times}

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw): self.t = time.perf_counter()
        def on_step_end(self, args, state, control, **kw):
            if state.global_step > warmup: times.append(time.perf_counter() - self.t)

    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Run the tests of module {i}."}]} for i in range(64)])
    def reward(completions, **kw): return [float("<tool_call>" in c[0]["content"]) + len(c[0]["content"]) / 64 for c in completions]
    with tempfile.TemporaryDirectory() as d:
        args = GRPOConfig(output_dir=d, per_device_train_batch_size=4, num_generations=4, max_completion_length=16,
                          max_steps=warmup + steps, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                          learning_rate=1e-3, seed=0, disable_tqdm=True, bf16=False, gradient_checkpointing=False)  # fp32, as DESIGN §7
        kw = dict(model=model, reward_funcs=reward, args=args, train_dataset=prompts, processing_class=tok, callbacks=[Timer()])
        if cfg == "grpo":
            tr = GRPOTrainer(**kw)
        else:
            tr = ComposerReplicationTrainer(**kw, trace_dataset=examples, data_collator=collator, trace_batch_size=1,
                                            alpha_sdpo=0.5, beta_replay=0.5)
        tr.train()
    return {"config": cfg, "step_s": times}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--worker", choices=CONFIGS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.warmup)))
        return 0
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    res = {}
    for cfg in CONFIGS:
        out = subprocess.run([sys.executable, __file__, "--worker", cfg, "--steps", str(args.steps), "--warmup", str(args.warmup)],
                             capture_output=True, text=True, env=env, cwd=ROOT)
        if out.returncode != 0:
            print(out.stderr[-2000:], file=sys.stderr)
            return 1
        r = json.loads(out.stdout.strip().splitlines()[-1])
        res[cfg] = statistics.mean(r["step_s"])
        print(f"{cfg:14s} {res[cfg]:7.3f} s/step  ({len(r['step_s'])} steps)")
    alone = res["grpo"] + res["sdpo_alone"] + res["dpo_alone"]
    ratios = {"three_channel/grpo": res["three_channel"] / res["grpo"], "three_channel/sum_alone": res["three_channel"] / alone}
    print(f"\n{'three_channel / grpo':32s} {ratios['three_channel/grpo']:.2f}x")
    print(f"{'three_channel / sum of channels':32s} {ratios['three_channel/sum_alone']:.2f}x  (sum = {alone:.3f} s)")
    dst = ROOT / "benchmarks/results/trainer.json"
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps({"step_s": res, "ratios": ratios, "steps": args.steps, "warmup": args.warmup}, indent=2))
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
