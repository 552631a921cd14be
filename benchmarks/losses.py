"""Benchmark the full-vocabulary loss channels: time and extra peak RSS of one forward+backward.

Side by side in one invocation, one fresh subprocess per (implementation, size), fp32, 2 threads,
glibc malloc told to return memory (so RSS follows the allocator). Sizes are DESIGN.md section 7:

    S0 N=128  d=64  V=4096     S1 N=1024 d=256 V=32000
    S2 N=2048 d=256 V=65536    S3 N=1024 d=512 V=151936 (Qwen vocabulary)

Generalized JSD (beta=0.5, teacher under no_grad, 1/8 of the tokens masked):
  jsd_naive       generalized_jsd_loss on full (N, V) logits (composer_replication.opsd)
  jsd_ours        linear_generalized_jsd_loss, chunk_size=1024, compiled=True (composer_replication.opsd: the
                  torch.compile'd per-chunk kernel; the default, compiled=None, compiles on CUDA only, where it pays)
  jsd_ours_eager  the same with compiled=False (the uncompiled path)
  jsd_trl         trl.experimental.gkd.GKDTrainer.generalized_jsd_loss on full logits
  jsd_liger       liger_kernel.chunked_loss.LigerFusedLinearJSDLoss, eager (compiled=False)
  jsd_liger_compiled  the same with compiled=True (torch.compile), reported if it finishes
Cross entropy (the LM-CE channel):
  ce_naive        F.cross_entropy on full logits
  ce_ours         composer_replication.loss_kernels.linear_cross_entropy, chunk_size=1024
  ce_torch        torch.nn.functional.linear_cross_entropy with LinearCrossEntropyOptions() (if present)

--interleave runs every requested implementation of a size in ONE subprocess, one warm-up each, then
`--repeat` rounds A, B, C, A, B, C, ...: each pass is timed and its extra peak RSS taken on its own
(VmHWM reset before each pass), and the medians over the rounds are reported. On a shared machine this is
the fair comparison: every implementation sees the same background load. The load average is recorded.

"extra peak RSS" is the process's peak resident set during the measured forward+backward passes
(VmHWM, reset through /proc/self/clear_refs) minus its resident set just before them, so inputs,
weights and imports are excluded. Time is the median of `--repeat` passes (15 at S0) after one warm-up.

Usage: python benchmarks/losses.py [--sizes S0,S1,S2,S3] [--impls jsd_naive,jsd_ours,...] [--repeat 3] [--interleave]
Writes benchmarks/results/losses.json (or --out).

Liger Kernel is only a peer here: its chunked losses are pure torch on the CPU, but the package declares
triton as a requirement, so it is installed without dependencies into benchmarks/.deps/ (git-ignored) on
first use, never into the environment, which stays `pip check` clean.
"""
from __future__ import annotations

import argparse, json, os, platform, statistics, subprocess, sys, time
from pathlib import Path

SIZES = {"S0": (128, 64, 4096), "S1": (1024, 256, 32000), "S2": (2048, 256, 65536), "S3": (1024, 512, 151936)}
JSD_IMPLS = ["jsd_naive", "jsd_ours", "jsd_ours_eager", "jsd_trl", "jsd_liger", "jsd_liger_compiled"]
CE_IMPLS = ["ce_naive", "ce_ours", "ce_torch"]
IMPLS = JSD_IMPLS + CE_IMPLS


LIGER = "liger-kernel==0.8.5"
DEPS = Path(__file__).resolve().parent / ".deps"

def _liger_deps() -> Path:
    "benchmarks/.deps with liger-kernel in it (pip install --no-deps --target on first use)."
    if not (DEPS / "liger_kernel").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(DEPS), LIGER], check=True)
    return DEPS


def _rss_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"): return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak():
    try: Path("/proc/self/clear_refs").write_text("5")
    except OSError: pass


def _inputs(size, seed=0):
    "Student and teacher hidden states, LM head and labels (1/8 masked) for `size`."
    import torch
    N, d, V = SIZES[size]
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(N, d, generator=g).requires_grad_()
    ht = torch.randn(N, d, generator=g)
    W = (torch.randn(V, d, generator=g) / d ** 0.5).requires_grad_()
    labels = torch.randint(0, V, (N,), generator=g)
    labels[torch.randperm(N, generator=g)[: N // 8]] = -100
    return hs, ht, W, labels


def _build(impl, size, seed=0, inputs=None):
    "Inputs and a closure doing one forward+backward for `impl`."
    import torch
    import torch.nn.functional as F
    hs, ht, W, labels = inputs or _inputs(size, seed)
    params = (hs, W)

    if impl == "jsd_naive":
        from composer_replication.opsd import generalized_jsd_loss
        def step():
            with torch.no_grad(): zt = ht @ W.T
            return generalized_jsd_loss(hs @ W.T, zt, labels)
    elif impl == "jsd_ours":
        from composer_replication.opsd import linear_generalized_jsd_loss
        def step(): return linear_generalized_jsd_loss(hs, ht, W, labels, teacher_weight=W.detach(), chunk_size=1024, compiled=True)
    elif impl == "jsd_ours_eager":
        from composer_replication.opsd import linear_generalized_jsd_loss
        def step(): return linear_generalized_jsd_loss(hs, ht, W, labels, teacher_weight=W.detach(), chunk_size=1024, compiled=False)
    elif impl == "jsd_trl":
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        from trl.experimental.gkd import GKDTrainer
        def step():
            with torch.no_grad(): zt = ht @ W.T
            return GKDTrainer.generalized_jsd_loss(hs @ W.T, zt, labels)
    elif impl in ("jsd_liger", "jsd_liger_compiled"):
        sys.path.insert(0, str(_liger_deps()))
        from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss
        fn = LigerFusedLinearJSDLoss(weight_hard_loss=0.0, weight_soft_loss=1.0, beta=0.5,
                                     compiled=impl.endswith("compiled"), chunk_size=1024)
        def step(): return fn(hs, W, ht, W.detach(), labels)
    elif impl == "ce_naive":
        def step(): return F.cross_entropy(hs @ W.T, labels)
    elif impl == "ce_ours":
        try: from composer_replication.loss_kernels import linear_cross_entropy
        except ImportError: from composer_replication.loss import linear_cross_entropy
        def step(): return linear_cross_entropy(hs, W, labels, chunk_size=1024)
    elif impl == "ce_torch":
        if not hasattr(F, "linear_cross_entropy"): raise ImportError("torch has no F.linear_cross_entropy")
        opts = torch.nn.LinearCrossEntropyOptions()
        def step(): return F.linear_cross_entropy(hs, W, labels, options=opts)
    else:
        raise ValueError(f"unknown impl {impl!r}")
    return step, params


def worker(impl, size, repeat):
    "Run in a fresh process: measure one implementation at one size and print a JSON line."
    import torch
    torch.set_num_threads(2)
    step, params = _build(impl, size)

    def once():
        for p in params: p.grad = None
        t0 = time.perf_counter()
        loss = step(); loss.backward()
        return time.perf_counter() - t0, float(loss), float(sum(p.grad.double().norm() ** 2 for p in params) ** 0.5)

    for p in params: p.grad = None
    base = _rss_kib("VmRSS"); _reset_peak()
    _, loss, gnorm = once()  # warm-up (and compile, for the compiled variant)
    if size == "S0": repeat = max(repeat, 15)  # milliseconds: more passes for a stable median
    times = [once()[0] for _ in range(repeat)]
    for p in params: p.grad = None
    peak = _rss_kib("VmHWM")
    print(json.dumps(dict(impl=impl, size=size, time_s=statistics.median(times), extra_peak_mib=(peak - base) / 1024,
                          loss=loss, grad_norm=gnorm)))


def worker_interleaved(impls, size, repeat):
    "Run in a fresh process: all `impls` at one size on shared inputs, passes interleaved; print one JSON line per impl."
    import torch
    torch.set_num_threads(2)
    inputs = _inputs(size)
    steps, errors = {}, {}
    for impl in impls:
        try: steps[impl] = _build(impl, size, inputs=inputs)
        except Exception as e: errors[impl] = f"{type(e).__name__}: {e}"[:200]

    def once(impl):
        step, params = steps[impl]
        for p in params: p.grad = None
        base = _rss_kib("VmRSS"); _reset_peak()
        t0 = time.perf_counter()
        loss = step(); loss.backward()
        dt = time.perf_counter() - t0
        peak = _rss_kib("VmHWM")
        out = dt, (peak - base) / 1024, float(loss), float(sum(p.grad.double().norm() ** 2 for p in params) ** 0.5)
        for p in params: p.grad = None
        return out

    first = {}
    for impl in list(steps):  # warm-up (and compile)
        try: first[impl] = once(impl)
        except Exception as e: errors[impl] = f"{type(e).__name__}: {e}"[:200]; del steps[impl]
    if size == "S0": repeat = max(repeat, 15)
    runs = {impl: [] for impl in steps}
    loads = [os.getloadavg()[0]]
    for _ in range(repeat):
        for impl in steps: runs[impl].append(once(impl))
        loads.append(os.getloadavg()[0])
    for impl in impls:
        if impl in errors: print(json.dumps(dict(impl=impl, size=size, error=errors[impl]))); continue
        r = runs[impl]
        print(json.dumps(dict(impl=impl, size=size, time_s=statistics.median(x[0] for x in r), times_s=[x[0] for x in r],
                              extra_peak_mib=statistics.median(x[1] for x in r), warmup_s=first[impl][0],
                              loss=first[impl][2], grad_norm=first[impl][3], loadavg=statistics.median(loads))))


def run_interleaved(impls, size, repeat, timeout):
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0",
               OMP_NUM_THREADS="2", TRL_EXPERIMENTAL_SILENCE="1")
    cmd = [sys.executable, __file__, "--worker-interleaved", ",".join(impls), size, "--repeat", str(repeat)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout * len(impls))
    except subprocess.TimeoutExpired:
        return [dict(impl=i, size=size, error=f"timed out after {timeout * len(impls)}s") for i in impls]
    got = {r["impl"]: r for r in (json.loads(l) for l in p.stdout.splitlines() if l.startswith("{"))}
    err = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1][:200]
    return [got.get(i, dict(impl=i, size=size, error=err)) for i in impls]


def run_one(impl, size, repeat, timeout):
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0",
               OMP_NUM_THREADS="2", TRL_EXPERIMENTAL_SILENCE="1")
    cmd = [sys.executable, __file__, "--worker", impl, size, "--repeat", str(repeat)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(impl=impl, size=size, error=f"timed out after {timeout}s")
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        err = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        return dict(impl=impl, size=size, error=err[:200])
    return json.loads(lines[-1])


def table(results, sizes, impls, liger_ref="jsd_liger"):
    "Text table of times and memory with ratios to the naive path and to `liger_ref` (ce_torch for CE rows)."
    by = {(r["impl"], r["size"]): r for r in results}
    out = []
    hdr = f"{'size':4} {'impl':20} {'time s':>8} {'x naive':>8} {'x liger':>8} {'extra MiB':>10} {'x naive':>8} {'x liger':>8}  loss"
    out.append(hdr); out.append("-" * len(hdr))
    for size in sizes:
        for impl in impls:
            r = by.get((impl, size))
            if r is None: continue
            if "error" in r:
                out.append(f"{size:4} {impl:20} {'error: ' + r['error']}"); continue
            fam = impl.split("_")[0]
            naive = by.get((f"{fam}_naive", size), {})
            liger = by.get((liger_ref, size), {}) if fam == "jsd" else by.get(("ce_torch", size), {})
            def ratio(a, b, k): return f"{a[k] / b[k]:8.2f}" if k in a and k in b and b[k] > 0 else f"{'-':>8}"
            out.append(f"{size:4} {impl:20} {r['time_s']:8.3f} {ratio(r, naive, 'time_s')} {ratio(r, liger, 'time_s')} "
                       f"{r['extra_peak_mib']:10.1f} {ratio(r, naive, 'extra_peak_mib')} {ratio(r, liger, 'extra_peak_mib')}  {r['loss']:.6g}")
    loads = sorted({round(r["loadavg"], 1) for r in results if "loadavg" in r})
    out.append(f"('x liger' is relative to {liger_ref}; for CE rows to ce_torch, torch's own chunked linear_cross_entropy)")
    out.append(f"1-min load average during the passes: {loads if loads else os.getloadavg()[0]:}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="S0,S1,S2,S3")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per (impl, size) subprocess")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "losses.json"))
    ap.add_argument("--interleave", action="store_true", help="all impls of a size in one process, passes interleaved")
    ap.add_argument("--liger-ref", default=None, help="impl the 'x liger' columns divide by (default jsd_liger_compiled with --interleave)")
    ap.add_argument("--worker", nargs=2, metavar=("IMPL", "SIZE"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-interleaved", nargs=2, metavar=("IMPLS", "SIZE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker: return worker(*a.worker, a.repeat)
    if a.worker_interleaved: return worker_interleaved(a.worker_interleaved[0].split(","), a.worker_interleaved[1], a.repeat)
    sizes, impls = a.sizes.split(","), a.impls.split(",")
    for s in sizes:
        if s not in SIZES: ap.error(f"unknown size {s!r}; choose from {list(SIZES)}")
    for i in impls:
        if i not in IMPLS: ap.error(f"unknown impl {i!r}; choose from {IMPLS}")
    results = []
    for size in sizes:
        if a.interleave:
            for r in run_interleaved(impls, size, a.repeat, a.timeout): results.append(r); print(json.dumps(r), flush=True)
            continue
        for impl in impls:
            r = run_one(impl, size, a.repeat, a.timeout); results.append(r)
            print(json.dumps(r), flush=True)
    ref = a.liger_ref or ("jsd_liger_compiled" if a.interleave else "jsd_liger")
    txt = table(results, sizes, impls, ref)
    print(txt)
    out = Path(a.out); out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(sizes={k: SIZES[k] for k in sizes}, repeat=a.repeat, interleave=a.interleave,
                                   loadavg=os.getloadavg(), machine=platform.platform(),
                                   cpus=os.cpu_count(), results=results, table=txt), indent=1))
    print("wrote", out)


if __name__ == "__main__":
    main()
