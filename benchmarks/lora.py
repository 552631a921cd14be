"""Step time and peak memory of LoRA adapters against top-8-layer and full training, on SmolLM2-135M-Instruct.

    python benchmarks/lora.py [--steps 3] [--warmup 1] [--max-seq-len 1536] [--configs lora,top8,full]

Each configuration runs in two subprocesses (torch.set_num_threads(2), fp32): the step times come from one with glibc's
default allocator, the peak RSS from one with MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0 (the peak of live
memory, not of what the allocator kept; those settings slow every large allocation down, so they are not timed).
Each trains ComposerOfflineTrainer on the sample session at the experiment's lengths (experiments/evidence.py: rows of up to 1,536 tokens, DPO sides of up to 1,024, per-device
batch 1, AdamW, all three channels with alpha = beta = 0.5, unchunked losses unless --chunk-size N, no activation
checkpointing unless --gradient-checkpointing; --profile adds each configuration's top operators):

  lora   peft LoRA, r=16, alpha=32, no dropout, on every attention and MLP projection (q k v o gate up down) of the
         30 layers; the DPO reference is the same model with its adapters disabled
  top8   the top 8 decoder layers and the final norm train (the experiment's default); the reference is a frozen copy
  full   every weight trains; the reference is a frozen copy
  lora_stock  (on request) the same adapters in peft's stock LoRA layers instead of add_lora's fused ones

It prints the mean seconds per optimizer step (after the warm-up steps) and the process's peak RSS, with the ratios
lora / full and top8 / full, and writes benchmarks/results/lora.json. The goal set in issue 25: LoRA at most 0.8x full
training's step time at most 0.6x its peak memory.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("lora", "top8", "full", "lora_stock")
# The memory run's allocator settings: every block of 64 KiB or more is its own mmap, returned to the system when freed, so
# peak RSS is the peak of live memory rather than of what glibc kept. They make each large tensor's pages fault in anew
# (a LoRA step took ~2x longer under them), so step times come from a run with glibc's defaults.
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
PAIR_FIXES = {2: '[TOOL_USE] name=Edit input={"file_path": "/home/user/calc/calc/core.py", "new_string": "    return a + b", "old_string": "    return a - b"}',
              6: '[TOOL_USE] name=Read input={"file_path": "/home/user/calc/tests/test_calc.py"}'}


def worker(cfg: str, steps: int, warmup: int, max_seq_len: int, max_dpo_seq_len: int, student: str, chunk_size: int = 0,
           checkpointing: bool = False, profile: bool = False) -> dict:
    import importlib.resources, logging, resource, tempfile, warnings
    import torch
    from transformers import TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback
    from composer_replication.hint_generator import dispatch
    from composer_replication.ingestion.claude_code import ClaudeCodeIngester
    from composer_replication.models import load_student
    from composer_replication.models import train_top_layers
    from composer_replication.trainer import ComposerOfflineTrainer
    from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator, trace_examples_from_states
    logging.getLogger("transformers").setLevel(logging.ERROR); warnings.filterwarnings("ignore")
    torch.set_num_threads(2); torch.manual_seed(0)
    rss_before_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    spec = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0}
    model, tok = load_student(student, lora=spec if cfg == "lora" else None)
    if cfg == "lora_stock":   # the same adapters in peft's stock layers (add_lora registers its fused layer)
        import peft
        from composer_replication.models import lora_config
        model = peft.get_peft_model(model, lora_config(spec))
    trained = train_top_layers(model, 8) if cfg == "top8" else None
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    sample = Path(importlib.resources.files("composer_replication")) / "assets/sample_session/demo-calc-fix.jsonl"
    states = list(ClaudeCodeIngester().ingest(sample))
    pairs = [{"state_id": states[i]["state_id"], "state_messages": states[i]["messages"], "chosen": a,
              "rejected": states[i]["student_action"], "n_teachers_agreeing": 3} for i, a in PAIR_FIXES.items()]
    examples = trace_examples_from_states(states, pairs=pairs)
    collator = ComposerDataCollator(tok, CollatorConfig(pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0,
                                                        hint_generator=dispatch, max_seq_len=max_seq_len, max_dpo_seq_len=max_dpo_seq_len))
    rows = collator.windows(examples)
    probe = [collator([r]) for r in rows]
    shape = {"rows": len(rows), "tokens": [int(b["input_ids"].shape[1]) for b in probe],
             "sdpo_targets": [int(b["sdpo_loss_mask"].sum()) if "sdpo_loss_mask" in b else 0 for b in probe],
             "pairs": [int(b["dpo_chosen_input_ids"].shape[0]) if "dpo_chosen_input_ids" in b else 0 for b in probe]}
    times, t = [], {}

    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile else None

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if prof is not None and state.global_step == warmup: prof.start()
            t["0"] = time.perf_counter()
        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - t["0"])
            if prof is not None and state.global_step == warmup + steps: prof.stop()

    with tempfile.TemporaryDirectory() as d:
        args = TrainingArguments(output_dir=d, max_steps=warmup + steps, per_device_train_batch_size=1, learning_rate=1e-4, logging_steps=1,
                                 save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True, lr_scheduler_type="constant",
                                 max_grad_norm=1.0, gradient_checkpointing=checkpointing,
                                 gradient_checkpointing_kwargs={"use_reentrant": False} if checkpointing else None)
        tr = ComposerOfflineTrainer(model, args, train_dataset=rows * (warmup + steps), data_collator=collator, alpha_sdpo=0.5, beta_replay=0.5,
                                    chunk_size=chunk_size or None)
        tr.remove_callback(PrinterCallback); tr.add_callback(Timer())
        tr.train()
        logs = [l for l in tr.state.log_history if "composer/total" in l]
        ref = tr.reference
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    measured = times[warmup:]
    ops = None
    if prof is not None:   # the measured steps' operators by their own CPU time (summed over the steps)
        ka = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]
        ops = [{"op": e.key, "calls": e.count, "self_s": e.self_cpu_time_total / 1e6, "total_s": e.cpu_time_total / 1e6} for e in ka]
    return {"config": cfg, "trainable_params": n_train, "params": sum(p.numel() for p in model.parameters()), "reference": ref,
            "trained": trained["layers"] if trained else ("LoRA r=16 on q,k,v,o,gate,up,down" + (", peft's stock layers" if cfg == "lora_stock" else "")
                                                    if cfg.startswith("lora") else "every weight"),
            "step_s": measured, "mean_step_s": sum(measured) / len(measured), "warmup_step_s": times[:warmup],
            "peak_rss_mb": peak_kb / 1024, "rss_before_load_mb": rss_before_load / 1024, "shape": shape,
            "last": {k.split("/")[1]: logs[-1][k] for k in logs[-1] if k.startswith("composer/")}, "ops": ops}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3, help="measured optimizer steps per configuration (default: 3)")
    p.add_argument("--warmup", type=int, default=1, help="steps run first and not measured (default: 1)")
    p.add_argument("--max-seq-len", type=int, default=1536)
    p.add_argument("--max-dpo-seq-len", type=int, default=1024)
    p.add_argument("--configs", default=",".join(CONFIGS[:3]), help=f"comma-separated subset of {','.join(CONFIGS)} (default: the first three)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="the student (tiny: a smoke test of this script)")
    p.add_argument("--chunk-size", type=int, default=0, help="score the LM head chunk by chunk (the losses' chunk_size; 0: full logits)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute each layer in the backward pass (every configuration)")
    p.add_argument("--profile", action="store_true", help="torch.profiler over the measured steps: each configuration's top operators by own CPU time")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.steps, a.warmup, a.max_seq_len, a.max_dpo_seq_len, a.model, a.chunk_size,
                                a.gradient_checkpointing, a.profile)))
        return 0
    base = {**os.environ, "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for k in MALLOC: base.pop(k, None)
    res = {}
    for cfg in a.configs.split(","):
        if cfg not in CONFIGS: p.error(f"--configs: unknown configuration {cfg!r}; choose from {', '.join(CONFIGS)}")
        cmd = [sys.executable, __file__, "--worker", cfg, "--steps", str(a.steps), "--warmup", str(a.warmup),
               "--max-seq-len", str(a.max_seq_len), "--max-dpo-seq-len", str(a.max_dpo_seq_len), "--model", a.model,
               "--chunk-size", str(a.chunk_size)] + ["--gradient-checkpointing"] * a.gradient_checkpointing
        runs = {}
        for what, env, extra in (("time", base, ["--profile"] * a.profile), ("memory", {**base, **MALLOC}, [])):
            r = subprocess.run(cmd + extra, env=env, capture_output=True, text=True)
            if r.returncode != 0: print(r.stderr[-3000:], file=sys.stderr); return 1
            runs[what] = json.loads(r.stdout.strip().splitlines()[-1])
        x = res[cfg] = {**runs["time"], "peak_rss_mb_default_malloc": runs["time"]["peak_rss_mb"], "peak_rss_mb": runs["memory"]["peak_rss_mb"],
                        "memory_run": {k: runs["memory"][k] for k in ("step_s", "mean_step_s", "peak_rss_mb", "rss_before_load_mb", "last")}}
        print(f"{cfg:5s}  {x['mean_step_s']:7.2f} s/step  peak RSS {x['peak_rss_mb']:7.0f} MB ({x['peak_rss_mb_default_malloc']:.0f} MB with "
              f"glibc's defaults)  trains {x['trainable_params']:>11,} of {x['params']:,} ({x['trained']}; reference: {x['reference']})", flush=True)
        for o in (x["ops"] or [])[:15]: print(f"       {o['self_s']:8.2f} s own  {o['calls']:6d} calls  {o['op']}")
    ratios = {}
    if "full" in res:
        f = res["full"]
        for c in ("lora", "top8", "lora_stock"):
            if c in res:
                ratios[c] = {"step_time_vs_full": res[c]["mean_step_s"] / f["mean_step_s"], "peak_rss_vs_full": res[c]["peak_rss_mb"] / f["peak_rss_mb"],
                             "peak_rss_default_malloc_vs_full": res[c]["peak_rss_mb_default_malloc"] / f["peak_rss_mb_default_malloc"]}
                print(f"{c} / full: step time {ratios[c]['step_time_vs_full']:.2f}x, peak RSS {ratios[c]['peak_rss_vs_full']:.2f}x "
                      f"({ratios[c]['peak_rss_default_malloc_vs_full']:.2f}x with glibc's defaults)")
        if "lora" in ratios:
            ok = ratios["lora"]["step_time_vs_full"] <= 0.8 and ratios["lora"]["peak_rss_vs_full"] <= 0.6
            print(f"goal (LoRA <= 0.8x full's step time at <= 0.6x its peak RSS): {'met' if ok else 'not met'}")
            ratios["goal_met"] = ok
    load = os.getloadavg()
    out = {"settings": vars(a) | {"worker": None}, "load_average": load, "results": res, "ratios": ratios, "torch_threads": 2}
    name = "lora" + (f"-chunk{a.chunk_size}" if a.chunk_size else "") + ("-ckpt" if a.gradient_checkpointing else "") + ("-profile" if a.profile else "")
    path = ROOT / (f"benchmarks/results/{name}.json" if a.model == "smollm2-135m-instruct" else f"/tmp/{name}-{a.model}.json")
    path.parent.mkdir(parents=True, exist_ok=True); path.write_text(json.dumps(out, indent=1))
    print(f"load average {load[0]:.2f}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
