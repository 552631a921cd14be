"""GPU check: the chunked JSD and CE against Liger's Triton kernels and the naive path, and the three-channel step.

    python benchmarks/gpu_check.py                    # CUDA, bf16: S2, S3 and Q (N=16384, d=896, V=151936), real student
    python benchmarks/gpu_check.py --small            # any device (CPU: fp32), small sizes, the tiny model: a smoke run
    python benchmarks/gpu_check.py --out results.json --rounds 5 --student tiny

One process; every implementation of a size is warmed up once (so torch.compile and Triton autotuning are
not timed), then `--rounds` rounds run them interleaved A, B, C, A, B, C, ... and the medians are compared.
Time is wall time around forward+backward with a device synchronize; memory is the extra peak of
torch.cuda.max_memory_allocated over the allocation before the pass (on CPU: the extra peak RSS, VmHWM reset
before each pass, as in benchmarks/losses.py).

Implementations (a row reads "skipped: why" where one is not available on this device):
  jsd_naive          generalized_jsd_loss on full (N, V) logits
  jsd_ours           linear_generalized_jsd_loss (compiled=None: torch.compile'd per-chunk kernel where it pays)
  jsd_ours_eager     the same, compiled=False
  jsd_liger_triton   liger_kernel.transformers.LigerFusedLinearJSD (Triton; CUDA only)
  jsd_liger_chunked  liger_kernel.chunked_loss.LigerFusedLinearJSDLoss (torch.compile'd on CUDA, eager on CPU)
  ce_naive           F.cross_entropy on full logits
  ce_ours            composer_replication linear_cross_entropy
  ce_liger_triton    liger_kernel.transformers.LigerFusedLinearCrossEntropyLoss (Triton; CUDA only)
  ce_torch           torch.nn.functional.linear_cross_entropy (where this torch has it)
Three-channel step (one AdamW step on the student: SmolLM2-135M-Instruct on CUDA, the tiny model with --small):
  step_three = LM CE + 0.5 SDPO + 0.5 DPO through compose_loss (chunked), against step_lm, step_sdpo, step_dpo
  alone; the table gives three / (sum of the three alone).
Liger is loaded from benchmarks/.deps (pip install --no-deps on first use, as in benchmarks/losses.py).
"""
from __future__ import annotations

import argparse, json, os, platform, statistics, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from losses import _liger_deps, _reset_peak, _rss_kib  # noqa: E402  (benchmarks/ is not a package)

GPU_SIZES = {"S2": (2048, 256, 65536), "S3": (1024, 512, 151936), "Q": (16384, 896, 151936)}
SMALL_SIZES = {"T0": (64, 32, 512), "T1": (256, 64, 4096)}
JSD = ["jsd_naive", "jsd_ours", "jsd_ours_eager", "jsd_liger_triton", "jsd_liger_chunked"]
CE = ["ce_naive", "ce_ours", "ce_liger_triton", "ce_torch"]
STEPS = ["step_three", "step_lm", "step_sdpo", "step_dpo"]


class Skip(Exception):
    "This implementation is not available here (the reason is the message)."


def _meter(device):
    "(sync, start, stop) functions: stop returns (seconds, extra peak MiB) since start."
    import torch
    if device.type == "cuda":
        def start():
            torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
            return time.perf_counter(), torch.cuda.memory_allocated()
        def stop(s):
            torch.cuda.synchronize()
            return time.perf_counter() - s[0], (torch.cuda.max_memory_allocated() - s[1]) / 2**20
    else:
        def start():
            base = _rss_kib("VmRSS"); _reset_peak()
            return time.perf_counter(), base
        def stop(s):
            dt = time.perf_counter() - s[0]
            return dt, (_rss_kib("VmHWM") - s[1]) / 1024
    return start, stop


def loss_impl(impl, inputs, device):
    "A closure doing one forward+backward of `impl` on `(hs, ht, W, labels)`, and the tensors whose grads it sets."
    import torch
    import torch.nn.functional as F
    hs, ht, W, labels = inputs
    cuda = device.type == "cuda"
    if impl.endswith("_triton") and not cuda: raise Skip("Triton kernels need CUDA")
    if "liger" in impl:
        sys.path.insert(0, str(_liger_deps()))
    if impl == "jsd_naive":
        from composer_replication.opsd import generalized_jsd_loss
        def step():
            with torch.no_grad(): zt = ht @ W.T
            return generalized_jsd_loss(hs @ W.T, zt, labels)
    elif impl in ("jsd_ours", "jsd_ours_eager"):
        from composer_replication.opsd import linear_generalized_jsd_loss
        compiled = False if impl.endswith("eager") else None
        def step(): return linear_generalized_jsd_loss(hs, ht, W, labels, teacher_weight=W.detach(), chunk_size=1024, compiled=compiled)
    elif impl == "jsd_liger_triton":
        from liger_kernel.transformers import LigerFusedLinearJSD
        fn = LigerFusedLinearJSD(jsd_beta=0.5)
        def step(): return fn(hs, W, ht, W.detach(), labels)
    elif impl == "jsd_liger_chunked":
        from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss
        fn = LigerFusedLinearJSDLoss(weight_hard_loss=0.0, weight_soft_loss=1.0, beta=0.5, compiled=cuda, chunk_size=1024)
        def step(): return fn(hs, W, ht, W.detach(), labels)
    elif impl == "ce_naive":
        def step(): return F.cross_entropy((hs @ W.T).float(), labels)
    elif impl == "ce_ours":
        try: from composer_replication.loss_kernels import linear_cross_entropy
        except ImportError: from composer_replication.loss import linear_cross_entropy
        def step(): return linear_cross_entropy(hs, W, labels, chunk_size=1024)
    elif impl == "ce_liger_triton":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        fn = LigerFusedLinearCrossEntropyLoss()
        def step(): return fn(W, hs, labels)
    elif impl == "ce_torch":
        if not hasattr(F, "linear_cross_entropy"): raise Skip("this torch has no F.linear_cross_entropy")
        opts = torch.nn.LinearCrossEntropyOptions()
        def step(): return F.linear_cross_entropy(hs, W, labels, options=opts)
    else:
        raise ValueError(f"unknown impl {impl!r}")
    return step, (hs, W)


def make_inputs(size, sizes, device, dtype, seed=0):
    import torch
    N, d, V = sizes[size]
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(N, d, generator=g).to(device, dtype).requires_grad_()
    ht = torch.randn(N, d, generator=g).to(device, dtype)
    W = (torch.randn(V, d, generator=g) / d ** 0.5).to(device, dtype).requires_grad_()
    labels = torch.randint(0, V, (N,), generator=g)
    labels[torch.randperm(N, generator=g)[: N // 8]] = -100
    return hs, ht, W, labels.to(device)


def step_impls(student, device, dtype, max_seq_len=1024, max_dpo_seq_len=512, train_layers=None, alpha=0.5, beta=0.5, only=None):
    "Closures doing one optimizer step of the three channels together and of each alone, on the collated sample batch."
    import copy
    import torch
    from composer_replication.loss import compose_loss, replay_channel_loss, sdpo_channel_loss
    from composer_replication.models import load_student
    from composer_replication.trainer.data_collator import precompute_ref_logprobs
    from trainer import _setup
    model, tok = load_student(student, dtype=dtype, device=device)
    model.train()
    from composer_replication.models import train_top_layers
    trained = train_top_layers(model, train_layers)
    tok, examples, collator = _setup(tok, max_seq_len, max_dpo_seq_len)
    ref = copy.deepcopy(model).eval()
    batch = collator(examples)
    batch = precompute_ref_logprobs(ref, {k: v for k, v in batch.items() if not k.endswith("_ref_logprobs")})
    batch = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}
    del ref
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    cs = 1024
    shape = {k: tuple(batch[k].shape) for k in ("input_ids", "ctx_teacher_input_ids", "dpo_chosen_input_ids", "dpo_rejected_input_ids") if k in batch}
    print(f"step batch on {student}: {shape}; training {trained['layers']} ({trained['trainable_params']:,} parameters); alpha {alpha}, beta {beta}",
          file=sys.stderr)
    losses = dict(step_three=lambda: compose_loss(model, batch, alpha_sdpo=alpha, beta_replay=beta, chunk_size=cs).total,
                  step_lm=lambda: compose_loss(model, batch, alpha_sdpo=0.0, beta_replay=0.0, chunk_size=cs).total,
                  step_sdpo=lambda: alpha * sdpo_channel_loss(model, batch, chunk_size=cs),
                  step_dpo=lambda: beta * replay_channel_loss(model, batch, chunk_size=cs))
    def closure(name):
        def step():
            opt.zero_grad(set_to_none=True)
            loss = losses[name]()
            loss.backward(); opt.step()
            return loss
        return step
    return {name: (closure(name), ()) for name in (only or STEPS)}


def measure(impls, device, rounds):
    "Warm each `(name -> (step, params))` once, then `rounds` interleaved passes; median seconds and extra MiB per name."
    start, stop = _meter(device)
    runs, first = {k: [] for k in impls}, {}
    def once(name):
        step, params = impls[name]
        for p in params: p.grad = None
        s = start(); loss = step()
        if params: loss.backward()
        dt, mib = stop(s)
        for p in params: p.grad = None
        return dt, mib, float(loss.detach())
    for name in impls: first[name] = once(name)
    for _ in range(rounds):
        for name in impls: runs[name].append(once(name))
    return {k: dict(time_s=statistics.median(x[0] for x in r), extra_mib=statistics.median(x[1] for x in r), loss=first[k][2])
            for k, r in runs.items()}


def ratio(a, b):
    return f"{a / b:7.2f}" if a is not None and b else f"{'-':>7}"


def run(small=False, rounds=3, student=None, sizes=None, device=None, dtype=None, steps=True, step_options=None):
    "Run the check; returns (rows, text table)."
    import torch
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    table = SMALL_SIZES if small else GPU_SIZES
    sizes = list(table) if sizes is None else sizes
    if device.type == "cpu": torch.set_num_threads(min(2, os.cpu_count() or 1))
    rows, lines = [], [f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else platform.processor() or 'cpu'}), "
                       f"{dtype}, torch {torch.__version__}, {rounds} interleaved rounds, medians; load average {os.getloadavg()}"]
    lines.append(f"{'size':5} {'impl':18} {'time s':>9} {'x naive':>7} {'x liger':>7} {'extra MiB':>10} {'x naive':>7} {'x liger':>7}  loss"
                 "   ('x liger': Liger's Triton kernel on CUDA; on CPU its chunked JSD, eager, and torch's chunked CE)")
    for size in sizes:
        inputs = make_inputs(size, table, device, dtype)
        for fam, names, liger in (("jsd", JSD, "jsd_liger_triton" if device.type == "cuda" else "jsd_liger_chunked"),
                                  ("ce", CE, "ce_liger_triton" if device.type == "cuda" else "ce_torch")):
            impls, skipped = {}, {}
            for name in names:
                try: impls[name] = loss_impl(name, inputs, device)
                except (Skip, ImportError) as e: skipped[name] = str(e)
            res = measure(impls, device, rounds)
            for name in names:
                if name in skipped:
                    rows.append(dict(size=size, impl=name, skipped=skipped[name])); lines.append(f"{size:5} {name:18} skipped: {skipped[name]}"); continue
                r, nv, lg = res[name], res.get(f"{fam}_naive"), res.get(liger)
                rows.append(dict(size=size, impl=name, **r))
                lines.append(f"{size:5} {name:18} {r['time_s']:9.4f} {ratio(r['time_s'], nv and nv['time_s'])} {ratio(r['time_s'], lg and lg['time_s'])} "
                             f"{r['extra_mib']:10.1f} {ratio(r['extra_mib'], nv and nv['extra_mib'])} {ratio(r['extra_mib'], lg and lg['extra_mib'])}  {r['loss']:.5g}")
        del inputs
        if device.type == "cuda": torch.cuda.empty_cache()
    if steps:
        student = student or ("tiny" if small or device.type == "cpu" else "smollm2-135m-instruct")
        res = measure(step_impls(student, device, dtype if device.type == "cuda" else torch.float32, **(step_options or {})), device, rounds)
        if set(res) != set(STEPS):   # --only: these steps alone in this process (its peak RSS is theirs)
            lines.append(f"steps on {student} ({step_options}): " + ", ".join(f"{k} {v['time_s']:.4f} s" for k, v in res.items())
                         + (f"; process peak RSS during the last pass {_rss_kib('VmHWM') / 1024:.0f} MiB" if device.type == "cpu" else ""))
            rows += [dict(size=student, impl=k, **v) for k, v in res.items()]
            lines.append(f"load average at the end {os.getloadavg()}")
            return rows, "\n".join(lines)
        alone = sum(res[k]["time_s"] for k in STEPS[1:])
        lines.append(f"three-channel step on {student} ({step_options or 'defaults'}): "
                     + ", ".join(f"{k} {res[k]['time_s']:.4f} s / {res[k]['extra_mib']:.0f} MiB" for k in STEPS)
                     + f"; three / sum of the channels alone = {res['step_three']['time_s'] / alone:.2f}x, three / lm alone = "
                     f"{res['step_three']['time_s'] / res['step_lm']['time_s']:.2f}x"
                     + (f"; process peak RSS during the last pass {_rss_kib('VmHWM') / 1024:.0f} MiB" if device.type == "cpu" else ""))
        rows += [dict(size=student, impl=k, **res[k]) for k in STEPS]
        rows.append(dict(size=student, impl="three_over_sum_alone", ratio=res["step_three"]["time_s"] / alone))
    lines.append(f"load average at the end {os.getloadavg()}")
    return rows, "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="small sizes and the tiny model (what the CPU test runs)")
    ap.add_argument("--sizes", default=None, help="comma-separated subset of the sizes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--student", default=None, help='load_student name (default: "smollm2-135m-instruct" on CUDA, "tiny" otherwise)')
    ap.add_argument("--device", default=None); ap.add_argument("--dtype", default=None, help="torch dtype name, e.g. bfloat16")
    ap.add_argument("--no-steps", action="store_true", help="skip the three-channel step")
    ap.add_argument("--steps-only", action="store_true", help="only the three-channel step (no kernel sizes)")
    ap.add_argument("--max-seq-len", type=int, default=1024); ap.add_argument("--max-dpo-seq-len", type=int, default=512)   # DPO sides share one prompt with the tool list
    ap.add_argument("--train-layers", type=int, default=None, help="train only the top N decoder layers (the ablation: 8)")
    ap.add_argument("--alpha", type=float, default=0.5); ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--only", default=None, help=f"comma-separated subset of {STEPS}: only these steps, in this process (for its peak RSS)")
    ap.add_argument("--out", default=str(HERE / "results" / "gpu_check.json"))
    a = ap.parse_args(argv)
    table = SMALL_SIZES if a.small else GPU_SIZES
    sizes = a.sizes.split(",") if a.sizes else None
    for s in sizes or []:
        if s not in table: ap.error(f"unknown size {s!r}; choose from {list(table)}")
    only = a.only.split(",") if a.only else None
    if only and not set(only) <= set(STEPS): ap.error(f"--only: choose from {STEPS}")
    opts = dict(max_seq_len=a.max_seq_len, max_dpo_seq_len=a.max_dpo_seq_len, train_layers=a.train_layers, alpha=a.alpha, beta=a.beta, only=only)
    rows, txt = run(a.small, a.rounds, a.student, [] if a.steps_only else sizes, a.device, a.dtype, not a.no_steps, opts)
    print(txt)
    out = Path(a.out); out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(rows=rows, table=txt, loadavg=os.getloadavg(), machine=platform.platform()), indent=1))
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
