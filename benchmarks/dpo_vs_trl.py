"""The DPO channel alone against TRL's DPOTrainer step: same pairs (same token ids), model and batch.

    python benchmarks/dpo_vs_trl.py [--rounds 3] [--steps 6] [--warmup 2] [--student tiny] [--chunk-size 1024]

Both sides train the same model from the same weights on the sample session's DPO pairs, collated once by
ComposerDataCollator; TRL is handed exactly those token ids (prompt = the chosen side's tokens before its
response, completions = the response tokens of each side), so neither tokenizes differently. Reference
log-probs are precomputed once on both sides (ours: precompute_ref_logprobs; TRL: precompute_ref_log_probs=True),
sigmoid DPO at beta=0.1, AdamW at the same learning rate, fp32, torch.set_num_threads(2).

  ours  replay_channel_loss(model, batch) + backward + AdamW step (the DPO channel as compose_loss runs it)
  trl   one DPOTrainer optimizer step (timed by a callback from on_step_begin to on_step_end)

Each measurement is a fresh subprocess that times `--steps` steps after `--warmup`; the two alternate
(ours, trl, ours, trl, ...) for `--rounds` rounds and the medians are compared: time per step and the
extra peak RSS of a step (VmHWM reset at the step's start, minus the RSS then). The load average is recorded.
Writes benchmarks/results/dpo_vs_trl.json.
"""
from __future__ import annotations

import argparse, json, os, platform, statistics, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
CONFIGS = ("ours", "trl")


def _pairs(tok):
    "The collated DPO batch and the same pairs as TRL-style token-id examples."
    from trainer import _setup
    tok, examples, collator = _setup(tok)
    batch = collator(examples)
    rows = []
    for k in range(batch["dpo_chosen_input_ids"].shape[0]):
        sides = {}
        for side in ("chosen", "rejected"):
            ids, resp = batch[f"dpo_{side}_input_ids"][k], batch[f"dpo_{side}_response_mask"][k].bool()
            att = batch.get(f"dpo_{side}_attention_mask")
            keep = att[k].bool() if att is not None else ids.new_ones(ids.shape, dtype=torch_bool())
            first = int(resp.nonzero()[0])
            sides[side] = (ids[:first][keep[:first]].tolist(), ids[resp & keep].tolist())
        rows.append(dict(prompt_ids=sides["chosen"][0], chosen_ids=sides["chosen"][1], rejected_ids=sides["rejected"][1],
                         same_prompt=sides["chosen"][0] == sides["rejected"][0]))
    return tok, batch, rows


def torch_bool():
    import torch
    return torch.bool


def _rss(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"): return int(line.split()[1])
    return 0


def _reset_peak():
    try: Path("/proc/self/clear_refs").write_text("5")
    except OSError: pass


def worker(cfg, steps, warmup, student, chunk_size, lr=1e-5):
    import copy, logging, tempfile, warnings
    import torch
    from composer_replication.models import load_student
    torch.set_num_threads(2); torch.manual_seed(0)
    logging.getLogger("transformers").setLevel(logging.ERROR); warnings.filterwarnings("ignore")
    model, tok = load_student(student)
    model.train()
    tok, batch, rows = _pairs(tok)
    P = len(rows)
    times, peaks = [], []
    if cfg == "ours":
        from composer_replication.loss import replay_channel_loss
        from composer_replication.trainer.data_collator import precompute_ref_logprobs
        ref = copy.deepcopy(model).eval()
        batch = precompute_ref_logprobs(ref, {k: v for k, v in batch.items() if not k.endswith("_ref_logprobs")})
        del ref
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        for i in range(warmup + steps):
            base = _rss("VmRSS"); _reset_peak(); t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = replay_channel_loss(model, batch, replay_dpo_beta=0.1, chunk_size=chunk_size)
            loss.backward(); opt.step()
            if i >= warmup: times.append(time.perf_counter() - t); peaks.append((_rss("VmHWM") - base) / 1024)
        return dict(config=cfg, step_s=times, peak_mib=peaks, pairs=P)

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.base = _rss("VmRSS"); _reset_peak(); self.t = time.perf_counter()
        def on_step_end(self, args, state, control, **kw):
            if state.global_step > warmup:
                times.append(time.perf_counter() - self.t); peaks.append((_rss("VmHWM") - self.base) / 1024)

    n = warmup + steps
    data = [{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in rows] * n
    ids = Dataset.from_list(data)

    class IdsDPOTrainer(DPOTrainer):  # hand TRL the very token ids our collator made (its reference precompute then runs on them)
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name): return ids

    with tempfile.TemporaryDirectory() as d:
        args = DPOConfig(output_dir=d, per_device_train_batch_size=P, max_steps=n, beta=0.1, loss_type=["sigmoid"],
                         precompute_ref_log_probs=True, max_length=None, use_cpu=True, bf16=False, fp16=False,
                         gradient_checkpointing=False, learning_rate=lr, report_to=[], save_strategy="no", logging_steps=1,
                         disable_tqdm=True, seed=0, dataloader_num_workers=0, max_grad_norm=0.0, lr_scheduler_type="constant",
                         warmup_steps=0, weight_decay=0.01)
        tr = IdsDPOTrainer(model=model, args=args, train_dataset=ids, processing_class=tok, callbacks=[Timer()])
        tr.train()
    return dict(config=cfg, step_s=times, peak_mib=peaks, pairs=P, same_prompt=all(r["same_prompt"] for r in rows))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--student", default="tiny", help="load_student name: tiny or smollm2-135m-instruct")
    ap.add_argument("--chunk-size", type=int, default=None, help="the DPO channel's chunk_size (None: full logits)")
    ap.add_argument("--worker", choices=CONFIGS)
    ap.add_argument("--out", default=str(HERE / "results" / "dpo_vs_trl.json"))
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a.worker, a.steps, a.warmup, a.student, a.chunk_size))); return 0
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2",
           "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    runs = {c: [] for c in CONFIGS}
    loads = []
    for r in range(a.rounds):
        for cfg in CONFIGS:
            cmd = [sys.executable, __file__, "--worker", cfg, "--steps", str(a.steps), "--warmup", str(a.warmup), "--student", a.student]
            if a.chunk_size: cmd += ["--chunk-size", str(a.chunk_size)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr); return 1
            res = json.loads(out.stdout.strip().splitlines()[-1])
            runs[cfg].append(res); loads.append(os.getloadavg()[0])
            print(f"round {r} {cfg:5s} median step {statistics.median(res['step_s']):.4f} s, extra peak {statistics.median(res['peak_mib']):.1f} MiB", flush=True)
    med = {c: dict(step_s=statistics.median(statistics.median(x["step_s"]) for x in runs[c]),
                   peak_mib=statistics.median(statistics.median(x["peak_mib"]) for x in runs[c])) for c in CONFIGS}
    ratios = {"time ours/trl": med["ours"]["step_s"] / med["trl"]["step_s"],
              "memory ours/trl": med["ours"]["peak_mib"] / med["trl"]["peak_mib"] if med["trl"]["peak_mib"] > 0 else None}
    txt = (f"DPO step on {a.student}, {runs['ours'][0]['pairs']} pairs, chunk_size={a.chunk_size}, {a.rounds} alternating rounds x {a.steps} steps\n"
           f"ours {med['ours']['step_s']:.4f} s/step, {med['ours']['peak_mib']:.1f} MiB extra peak\n"
           f"trl  {med['trl']['step_s']:.4f} s/step, {med['trl']['peak_mib']:.1f} MiB extra peak\n"
           f"ours / trl: time {ratios['time ours/trl']:.2f}x, memory {ratios['memory ours/trl'] if ratios['memory ours/trl'] is None else round(ratios['memory ours/trl'], 2)}x; "
           f"1-min load average {statistics.median(loads):.1f} (range {min(loads):.1f}-{max(loads):.1f})")
    print(txt)
    dst = Path(a.out); dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(dict(medians=med, ratios=ratios, runs=runs, loadavg=loads, table=txt, machine=platform.platform()), indent=1))
    print("wrote", dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
