"""Serverless DiLoCo beyond what a notebook cell can host: ObjectStoreAllReduce against a real S3 protocol server (moto on
127.0.0.1), replicas as processes meeting in S3, a replica crashing mid-run, atomic writes under concurrent reads, and a
property test of the averaging."""
import logging, os, sys, threading, time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from composer_replication.diloco.serverless import LocalProcessExecutor, MockManager, ObjectStoreAllReduce

sys.path.insert(0, str(Path(__file__).parent))  # diloco_helpers, also for spawned replicas (they inherit sys.path)
from diloco_helpers import run_ranks

ENTRY = "composer_replication.diloco.serverless.replica_entrypoint"


@pytest.fixture(scope="module")
def s3():
    "A moto S3 server on 127.0.0.1 (random port) with one bucket; yields fsspec storage options and the bucket name."
    pytest.importorskip("s3fs"); moto_server = pytest.importorskip("moto.server")
    import boto3
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0); server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket="diloco-test")
        yield {"endpoint_url": url, "key": "testing", "secret": "testing"}, "diloco-test"
    finally: server.stop()


def s3_keys(opts, prefix):
    import boto3
    c = boto3.client("s3", endpoint_url=opts["endpoint_url"], aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    return sorted(o["Key"] for o in c.list_objects_v2(Bucket="diloco-test", Prefix=prefix).get("Contents", []))


def test_s3_allreduce_rounds_identical_and_bounded(s3):
    opts, bucket = s3
    xs = [[torch.randn(257, 3) for _ in range(3)] for _ in range(4)]  # 4 rounds x 3 ranks
    def rank(k):
        s = ObjectStoreAllReduce(f"s3://{bucket}/avg", k, 3, poll_interval_s=0.05, timeout_s=60, storage_options=opts)
        return [s.allreduce(xs[r][k].clone()) for r in range(4)], s
    res = run_ranks(rank, 3)
    for k in range(3): assert not isinstance(res[k], BaseException), res[k]
    for r in range(4):
        ref = ((xs[r][0].double() + xs[r][1].double() + xs[r][2].double()) / 3).float()
        for k in range(3): assert torch.equal(res[k][0][r], ref)  # bit-identical on every rank, and the float64 mean
    assert [res[k][1].round_id for k in range(3)] == [4, 4, 4]
    assert s3_keys(opts, "avg/") == [f"avg/round_000003/rank_{k:04d}.safetensors" for k in range(3)]  # older rounds deleted


def test_s3_timeout_names_missing_ranks_and_mismatch(s3):
    opts, bucket = s3
    t0 = time.monotonic()
    res = run_ranks(lambda k: ObjectStoreAllReduce(f"s3://{bucket}/to", k, 4, timeout_s=1.0, poll_interval_s=0.1, storage_options=opts).allreduce(torch.ones(2)), 2)
    assert time.monotonic() - t0 < 20
    for e in res: assert isinstance(e, TimeoutError) and "rank(s) [2, 3]" in str(e), e
    res = run_ranks(lambda k: ObjectStoreAllReduce(f"s3://{bucket}/mm", k, 2, timeout_s=30, poll_interval_s=0.05, storage_options=opts).allreduce(torch.ones(2 + k)), 2)
    for e in res: assert isinstance(e, ValueError) and "shape" in str(e), e


def test_s3_serverless_diloco_with_processes(s3):
    "Two replica processes train the tiny LM with DiLoCo and meet only in S3."
    opts, bucket = s3
    ex = LocalProcessExecutor()
    hs = ex.launch_replicas(2, ENTRY, {"rendezvous_uri": f"s3://{bucket}/tiny-run/", "world_size": 2, "trainer_module": ENTRY,
                                       "trainer_fn": "train_tiny_replica",
                                       "trainer_kwargs": {"steps": 6, "sync_every": 3, "use_bucketization": True, "return_params": False},
                                       "store_kwargs": {"poll_interval_s": 0.05, "timeout_s": 240, "storage_options": opts}}, timeout=600)
    try: res = ex.collect(hs, timeout=600)
    finally:
        for h in hs: ex.cancel(h)
    assert [r["status"] for r in res] == ["succeeded"] * 2, [r["error"] for r in res]
    a, b = res[0]["result"], res[1]["result"]
    assert a["sync_steps"] == [3, 6] and a["sync_digests"] == b["sync_digests"] and a["rounds"] == 2
    assert a["losses"] != b["losses"]
    assert len(s3_keys(opts, "tiny-run/")) == 2  # only the last round's two files remain


def test_crashed_replica_fails_fast_and_peer_times_out(tmp_path):
    "A replica that dies before its first sync: collect reports it (exit code 9), and its peer's TimeoutError names it."
    ex = LocalProcessExecutor()
    t0 = time.monotonic()
    hs = ex.launch_replicas(2, ENTRY, {"rendezvous_uri": str(tmp_path / "rdv"), "world_size": 2, "trainer_module": "diloco_helpers",
                                       "trainer_fn": "linear_trainer", "trainer_kwargs": {"crash_rank": 1, "crash_at": 2},
                                       "store_kwargs": {"timeout_s": 5, "poll_interval_s": 0.05}}, timeout=300)
    try: r0, r1 = ex.collect(hs, timeout=300)
    finally:
        for h in hs: ex.cancel(h)
    assert time.monotonic() - t0 < 120
    assert (r1["status"], r1["exit_code"]) == ("failed", 9) and "exited with code 9" in r1["error"]
    assert (r0["status"], r0["exit_code"]) == ("failed", 1) and "TimeoutError" in r0["error"] and "rank(s) [1]" in r0["error"], r0["error"]


def test_linear_trainer_replicas_agree(tmp_path):
    "The same helper without the crash: both replicas finish with identical weights (so the crash test's failure is the crash)."
    ex = LocalProcessExecutor()
    hs = ex.launch_replicas(2, ENTRY, {"rendezvous_uri": str(tmp_path / "rdv"), "world_size": 2, "trainer_module": "diloco_helpers",
                                       "trainer_fn": "linear_trainer", "store_kwargs": {"timeout_s": 60, "poll_interval_s": 0.02}}, timeout=300)
    try: r0, r1 = ex.collect(hs, timeout=300)
    finally:
        for h in hs: ex.cancel(h)
    assert (r0["status"], r1["status"]) == ("succeeded", "succeeded"), (r0["error"], r1["error"])
    for n in r0["result"]: assert torch.equal(r0["result"][n], r1["result"][n])


def test_local_writes_are_atomic_under_concurrent_reads(tmp_path):
    "A reader polling while a writer re-posts 4 MB files never sees a partial file; a naive writer is caught doing so."
    s = ObjectStoreAllReduce(tmp_path, rank=0, world_size=1)
    path = s._rank_path(0, 0)
    tensors = [torch.full((1 << 20,), float(i)) for i in range(1, 4)]  # 4 MB each
    payloads = []
    for t in tensors: s._put(path, {"t": t}, {"i": "x"}); payloads.append(Path(path).read_bytes())
    by_payload = dict(zip(payloads, tensors))
    def hammer(write, n=40):
        stop, bad, seen = threading.Event(), [], [0]
        def reader():
            while not stop.is_set():
                try: data = Path(path).read_bytes()
                except FileNotFoundError: continue
                seen[0] += 1
                if data not in payloads: bad.append(len(data))
        t = threading.Thread(target=reader); t.start()
        try:
            for i in range(n): write(path, payloads[i % 3])
        finally: stop.set(); t.join()
        return bad, seen[0]
    bad, seen = hammer(lambda p, data: s._put(p, {"t": by_payload[data]}, {"i": "x"}))
    assert seen > 0 and bad == [], (seen, bad[:5])
    assert sorted(p.name for p in Path(path).parent.iterdir()) == ["rank_0000.safetensors"]  # no temporary files left
    def naive(p, data):
        with open(p, "wb") as f:
            f.write(data[: len(data) // 2]); f.flush(); time.sleep(0.002); f.write(data[len(data) // 2:])
    bad, _ = hammer(naive)
    assert bad, "the naive writer should have exposed a partial file (the reader is not looking)"


@settings(max_examples=25, deadline=None)
@given(world=st.integers(1, 4), shape=st.lists(st.integers(0, 5), min_size=0, max_size=3),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]), seed=st.integers(0, 2**16))
def test_average_property(world, shape, dtype, seed):
    "Any world size, shape (incl. empty and 0-d) and float dtype: every rank gets the float64 rank-order mean, bit for bit."
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(tuple(shape), generator=g).to(dtype) for _ in range(world)]
    uri = f"memory://prop-{seed}-{world}-{'x'.join(map(str, shape))}-{dtype}/"
    res = run_ranks(lambda k: ObjectStoreAllReduce(uri, k, world, poll_interval_s=0.005, timeout_s=30).allreduce(xs[k].clone()), world)
    acc = torch.zeros(shape, dtype=torch.float64)
    for x in xs: acc += x.double()
    ref = (acc / world).to(dtype)
    for r in res:
        assert not isinstance(r, BaseException), r
        assert r.dtype == dtype and r.shape == torch.Size(shape) and torch.equal(r, ref)


def test_mock_manager_drives_torchft_diloco_bucketized(tmp_path):
    "torchft's bucketized path chains .then() on the work's future: with MockManager it averages correctly in one round."
    from composer_replication.diloco import make_diloco_outer_loop
    torch.manual_seed(0); init = torch.nn.Linear(5, 3).state_dict()
    data = [[(torch.randn(4, 5), torch.randn(4, 3)) for _ in range(2)] for _ in range(2)]
    def train(k, diloco):
        m = torch.nn.Linear(5, 3); m.load_state_dict(init); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        mgr = MockManager(ObjectStoreAllReduce(tmp_path / "b", k, 2, poll_interval_s=0.01)) if diloco else None
        ctx = make_diloco_outer_loop(mgr, [m], opt, sync_every=2, outer_lr=1.0, outer_momentum=0.0, use_bucketization=True) if diloco else None
        if ctx: ctx.__enter__()
        for x, y in data[k]: opt.zero_grad(); torch.nn.functional.mse_loss(m(x), y).backward(); opt.step()
        if ctx: ctx.__exit__(None, None, None)
        return [p.detach().clone() for p in m.parameters()], (mgr.store.round_id if mgr else None)
    local = [train(k, False)[0] for k in range(2)]
    res = run_ranks(lambda k: train(k, True), 2)
    assert res[0][1] == 1  # one round for both tensors
    for p0, p1, l0, l1 in zip(res[0][0], res[1][0], *local):
        assert torch.equal(p0, p1)
        torch.testing.assert_close(p0, ((l0.double() + l1.double()) / 2).float(), atol=1e-6, rtol=0)


def test_reused_rendezvous_never_mixes_runs(tmp_path):
    "Issue 22: a stale peer file of an earlier run in a reused folder is never averaged (run ids from the executor's launch id)."
    rdv = tmp_path / "rdv"
    stale = rdv / "round_000000"; stale.mkdir(parents=True)   # an earlier run without an id left rank 1's round-0 file
    import safetensors.torch as sft
    sft.save_file({"tensor": torch.full((2,), 1000.0)}, str(stale / "rank_0001.safetensors"),
                  metadata={"format": "composer_replication.allreduce/1", "run": "", "round": "0", "rank": "1", "world_size": "2", "name": "tensor"})
    res = run_ranks(lambda k: ObjectStoreAllReduce(rdv, k, 2, run_id="live", poll_interval_s=0.01, timeout_s=30).allreduce(torch.full((2,), float(k))), 2)
    for r in res: assert torch.equal(r, torch.full((2,), 0.5)), r   # the live run's two values, not the stale 1000
    # the same folder without a run id: the round-0 file of another rank cannot be told apart, but a later round's can
    (rdv / "round_000003").mkdir(); sft.save_file({"tensor": torch.zeros(2)}, str(rdv / "round_000003" / "rank_0000.safetensors"))
    res = run_ranks(lambda k: ObjectStoreAllReduce(rdv, k, 2, poll_interval_s=0.01, timeout_s=5).allreduce(torch.ones(2)), 2)
    for e in res: assert isinstance(e, ValueError) and "holds files of an earlier run (" in str(e) and "round_000003/rank_0000.safetensors" in str(e), e
    # two launches of the executor into one folder: each meets under its own launch id and both train the same weights
    ex = LocalProcessExecutor(); results = []
    for _ in range(2):
        hs = ex.launch_replicas(2, ENTRY, {"rendezvous_uri": str(tmp_path / "shared"), "world_size": 2, "trainer_module": "diloco_helpers",
                                           "trainer_fn": "linear_trainer", "store_kwargs": {"timeout_s": 60, "poll_interval_s": 0.02}}, timeout=300)
        try: rs = ex.collect(hs, timeout=300)
        finally:
            for h in hs: ex.cancel(h)
        assert [r["status"] for r in rs] == ["succeeded"] * 2, [r["error"] for r in rs]
        results.append(rs[0]["result"])
    names = sorted(p.name for p in (tmp_path / "shared").iterdir())
    assert len(names) == 2 and all(n.startswith("run_") for n in names), names   # one folder per launch
    for n in results[0]: assert torch.equal(results[0][n], results[1][n])


def test_non_finite_peer_values_are_refused(tmp_path):
    "Issue 22: NaN or inf from a peer is a ValueError naming that peer on every rank, never an average."
    for bad in (float("nan"), float("inf"), float("-inf")):
        vals = [torch.ones(4), torch.tensor([1.0, 2.0, bad, 4.0])]
        res = run_ranks(lambda k: ObjectStoreAllReduce(tmp_path / f"r{bad}", k, 2, poll_interval_s=0.01, timeout_s=30).allreduce(vals[k].clone()), 2)
        assert isinstance(res[0], ValueError) and "rank 1 posted 'tensor' with non-finite values" in str(res[0]), res[0]
        assert isinstance(res[1], ValueError) and "rank 1 (this replica)" in str(res[1]), res[1]
    # through MockManager as torchft's DiLoCo calls it: a bf16 parameter with a NaN stops the sync
    m = MockManager(ObjectStoreAllReduce(tmp_path / "one", 0, 1))
    try: m.allreduce(torch.tensor([0.0, float("nan")], dtype=torch.bfloat16)); raise AssertionError("accepted")
    except ValueError as e: assert "1 NaN, 0 inf of 2" in str(e)
