#!/usr/bin/env python
"""Round latency of `ObjectStoreAllReduce` over file:// and s3:// (moto on 127.0.0.1) next to torch.distributed gloo
`all_reduce` on localhost, for 1, 16 and 64 MB float32 tensors on 2 and 4 ranks; plus bytes communicated per inner step
by DiLoCo compared with DDP (1/H).

Each (implementation, ranks, size) runs in its own subprocess, which spawns one process per rank (1 torch thread each).
Every round starts from a barrier; a round's latency is the slowest rank's time inside the call (the round is over when
the last rank has its result). The first round is a warm-up and is not counted.

    .venv/bin/python benchmarks/allreduce.py            # full grid (a few minutes on 2 cores)
    .venv/bin/python benchmarks/allreduce.py --quick    # 16 MB only
Results: a table on stdout and benchmarks/results/allreduce.json.
"""
import argparse, json, os, platform, resource, socket, statistics, subprocess, sys, tempfile, time, uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROUNDS = {"gloo": {1: 15, 16: 10, 64: 4}, "file": {1: 15, 16: 10, 64: 4}, "s3": {1: 10, 16: 6, 64: 3}}  # per run
REPEATS = {"gloo": 3, "file": 3, "s3": 1}  # gloo and file runs alternate, so a burst of load from elsewhere hits both


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def _rank(impl, rank, world, size_mb, rounds, barrier, q, uri, port, storage_options):
    import torch
    torch.set_num_threads(1)
    x = torch.randn(size_mb * 2**20 // 4, generator=torch.Generator().manual_seed(rank))
    if impl == "gloo":
        import torch.distributed as dist
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        def op(t): dist.all_reduce(t); t.div_(world)  # the same average the object store computes
    else:
        from composer_replication.diloco.serverless.allreduce import ObjectStoreAllReduce
        store = ObjectStoreAllReduce(uri, rank, world, timeout_s=600, storage_options=storage_options)
        op = store.allreduce
    times = []
    for r in range(rounds + 1):
        barrier.wait()
        t0 = time.perf_counter(); op(x); dt = time.perf_counter() - t0
        if r: times.append(dt)
    if impl == "gloo": dist.barrier(); dist.destroy_process_group()
    q.put((rank, times, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def one(impl: str, world: int, size_mb: int, rounds: int) -> dict:
    "Run one configuration with `world` rank processes; return its latency statistics."
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(world), ctx.Queue()
    server, uri, opts, port, tmp = None, None, None, _free_port(), None
    if impl == "s3":
        import boto3, logging
        from moto.server import ThreadedMotoServer
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0); server.start()
        host, p = server.get_host_and_port(); url = f"http://{host}:{p}"
        boto3.client("s3", endpoint_url=url, aws_access_key_id="bench", aws_secret_access_key="bench", region_name="us-east-1").create_bucket(Bucket="bench")
        uri, opts = f"s3://bench/{uuid.uuid4().hex}/", {"endpoint_url": url, "key": "bench", "secret": "bench"}
    elif impl == "file":
        tmp = tempfile.mkdtemp(prefix="allreduce-bench-"); uri = f"file://{tmp}"
    procs = [ctx.Process(target=_rank, args=(impl, r, world, size_mb, rounds, barrier, q, uri, port, opts)) for r in range(world)]
    try:
        for p in procs: p.start()
        got = [q.get(timeout=1800) for _ in range(world)]
        for p in procs: p.join(60)
    finally:
        for p in procs:
            if p.is_alive(): p.kill()
        if server is not None: server.stop()
        if tmp is not None:
            import shutil; shutil.rmtree(tmp, ignore_errors=True)
    per_round = [max(t[i] for _, t, _ in got) for i in range(rounds)]
    return {"impl": impl, "world": world, "size_mb": size_mb, "round_ms": [1e3 * t for t in per_round],
            "max_rss_mb": max(m for _, _, m in got), "loadavg": os.getloadavg()[0]}


def _stats(impl, world, size_mb, runs: list[dict]) -> dict:
    "Pool the rounds of repeated runs: p50, p95, mean, and each run's median."
    ms = sorted(t for r in runs for t in r["round_ms"])
    return {"impl": impl, "world": world, "size_mb": size_mb, "rounds": len(ms), "p50_ms": statistics.median(ms),
            "p95_ms": ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))], "mean_ms": statistics.fmean(ms),
            "run_p50_ms": [statistics.median(r["round_ms"]) for r in runs], "max_rss_mb": max(r["max_rss_mb"] for r in runs),
            "loadavg": [r["loadavg"] for r in runs]}


def bytes_per_step(world: int = 2, H: int = 5, steps: int = 10) -> dict:
    "Measure the store traffic of a real serverless DiLoCo run (tiny LM, `world` replica processes, file://) and compare with DDP."
    import shutil
    from composer_replication.diloco.serverless import LocalProcessExecutor
    entry = "composer_replication.diloco.serverless.replica_entrypoint"
    tmp = tempfile.mkdtemp(prefix="allreduce-bytes-")
    try:
        ex = LocalProcessExecutor()
        hs = ex.launch_replicas(world, entry, {"rendezvous_uri": tmp, "world_size": world, "trainer_module": entry, "trainer_fn": "train_tiny_replica",
                                               "trainer_kwargs": {"steps": steps, "sync_every": H, "use_bucketization": True, "return_params": False},
                                               "store_kwargs": {"poll_interval_s": 0.02}}, timeout=1200)
        res = ex.collect(hs, timeout=1200)
    finally: shutil.rmtree(tmp, ignore_errors=True)
    if any(r["status"] != "succeeded" for r in res): raise RuntimeError(f"replicas failed: {[r['error'] for r in res]}")
    out = [r["result"] for r in res]
    from composer_replication.tiny import tiny_causal_lm
    P = sum(p.numel() for p in tiny_causal_lm().parameters()); model_bytes = 4 * P
    ddp = 2 * (world - 1) / world * model_bytes  # ring all-reduce: bytes each rank sends per step (and receives)
    rows = []
    for h in (1, 10, 100, 500):
        rows.append({"H": h, "ddp_sent_per_step": ddp, "diloco_gloo_sent_per_step": ddp / h,
                     "diloco_store_written_per_step": model_bytes / h, "diloco_store_read_per_step": (world - 1) * model_bytes / h,
                     "ratio_vs_ddp": 1 / h})
    measured = {"H": H, "world": world, "written_per_step": out[0]["bytes_written"] / steps, "read_per_step": out[0]["bytes_read"] / steps,
                "expected_written_per_step": model_bytes / H, "rounds": out[0]["rounds"]}
    return {"params": P, "model_bytes": model_bytes, "world": world, "table": rows, "measured": measured}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 MB only")
    ap.add_argument("--impls", default="gloo,file,s3")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--sizes", default="1,16,64")
    ap.add_argument("--one", nargs=4, metavar=("IMPL", "WORLD", "SIZE_MB", "ROUNDS"), help=argparse.SUPPRESS)
    ap.add_argument("--bytes", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bytes-only", action="store_true", help="only the bytes-per-step table (merged into an existing JSON)")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), int(a.one[2]), int(a.one[3])))); return
    if a.bytes:
        print(json.dumps(bytes_per_step())); return
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "PYTHONPATH": str(HERE.parent)}
    if a.bytes_only:
        bps = _bytes_table(env); path = HERE / "results" / "allreduce.json"
        out = json.loads(path.read_text()) if path.exists() else {}
        out["bytes_per_step"] = bps; path.parent.mkdir(exist_ok=True); path.write_text(json.dumps(out, indent=1)); print("wrote", path); return
    impls, worlds = a.impls.split(","), [int(w) for w in a.worlds.split(",")]
    sizes = [16] if a.quick else [int(s) for s in a.sizes.split(",")]
    results = []
    for world in worlds:
        for size in sizes:
            runs = {i: [] for i in impls}
            for rep_ in range(max(REPEATS[i] for i in impls)):
                for impl in impls:
                    if rep_ >= REPEATS[impl]: continue
                    r = subprocess.run([sys.executable, __file__, "--one", impl, str(world), str(size), str(ROUNDS[impl][size])],
                                       capture_output=True, text=True, env=env, timeout=3600)
                    if r.returncode: print(f"{impl} world={world} {size} MB failed:\n{r.stderr[-3000:]}", file=sys.stderr); continue
                    runs[impl].append(json.loads(r.stdout.strip().splitlines()[-1]))
            for impl in impls:
                if not runs[impl]: continue
                res = _stats(impl, world, size, runs[impl]); results.append(res)
                print(f"  {impl:5s} ranks={world} {size:3d} MB: p50 {res['p50_ms']:9.1f} ms  p95 {res['p95_ms']:9.1f} ms  (rounds {res['rounds']}, "
                      f"run medians {[round(x) for x in res['run_p50_ms']]}, load avg {[round(x, 1) for x in res['loadavg']]}, max RSS {res['max_rss_mb']:.0f} MB)", flush=True)
    print("\nRound latency (ms), slowest rank per round; ratio = p50 / gloo p50")
    print(f"{'ranks':>5} {'MB':>4} | " + " | ".join(f"{i + ' p50':>11} {i + ' p95':>11}" for i in impls) + " | " + " ".join(f"{i + '/gloo':>10}" for i in impls if i != "gloo"))
    by = {(r["impl"], r["world"], r["size_mb"]): r for r in results}
    for world in worlds:
        for size in sizes:
            cells, ratios = [], []
            for i in impls:
                r = by.get((i, world, size))
                cells.append(f"{r['p50_ms']:11.1f} {r['p95_ms']:11.1f}" if r else f"{'-':>11} {'-':>11}")
            g = by.get(("gloo", world, size))
            for i in impls:
                if i == "gloo": continue
                r = by.get((i, world, size))
                ratios.append(f"{r['p50_ms'] / g['p50_ms']:10.2f}" if r and g else f"{'-':>10}")
            print(f"{world:>5} {size:>4} | " + " | ".join(cells) + " | " + " ".join(ratios))
    bps = _bytes_table(env)
    out = {"host": {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine(), "file_dir": tempfile.gettempdir()},
           "note": "timings taken on a shared 2-core machine (see loadavg per run); 1 torch thread per rank", "results": results, "bytes_per_step": bps}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "allreduce.json").write_text(json.dumps(out, indent=1))
    target = [(by.get(("file", 4, 16)), by.get(("gloo", 4, 16)))]
    if all(target[0]):
        f, g = target[0]
        print(f"\ntarget file:// 16 MB x 4 ranks within 3x gloo: {f['p50_ms']:.1f} / {g['p50_ms']:.1f} ms = {f['p50_ms'] / g['p50_ms']:.2f}x "
              f"-> {'met' if f['p50_ms'] <= 3 * g['p50_ms'] else 'NOT met'}")
    print("wrote", HERE / "results" / "allreduce.json")


def _bytes_table(env) -> dict:
    "Run the bytes-per-step measurement in a subprocess and print its table."
    r = subprocess.run([sys.executable, __file__, "--bytes"], capture_output=True, text=True, env=env, timeout=1800)
    bps = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr[-2000:]}
    if "table" in bps:
        print(f"\nBytes per inner step per rank, tiny LM ({bps['params']:,} fp32 params = {bps['model_bytes'] / 2**20:.2f} MiB), {bps['world']} replicas")
        print(f"{'H':>5} {'DDP ring sent':>14} {'DiLoCo gloo':>12} {'store write':>12} {'store read':>11} {'vs DDP':>7}")
        for row in bps["table"]:
            print(f"{row['H']:>5} {row['ddp_sent_per_step'] / 2**10:11.1f} KiB {row['diloco_gloo_sent_per_step'] / 2**10:8.1f} KiB "
                  f"{row['diloco_store_written_per_step'] / 2**10:8.1f} KiB {row['diloco_store_read_per_step'] / 2**10:7.1f} KiB {row['ratio_vs_ddp']:7.3f}")
        m = bps["measured"]
        print(f"measured (H={m['H']}, {m['rounds']} rounds): written {m['written_per_step'] / 2**10:.1f} KiB/step "
              f"(expected {m['expected_written_per_step'] / 2**10:.1f} + safetensors headers), read {m['read_per_step'] / 2**10:.1f} KiB/step")
    else: print("bytes-per-step measurement failed:", bps.get("error"), file=sys.stderr)
    return bps


if __name__ == "__main__":
    main()
