"""HFJobsExecutor through the real `huggingface_hub` client against a loopback stand-in of the Hub's jobs endpoints
(127.0.0.1, stopped by every test): the exact requests, a DiLoCo round between two "jobs" (local processes behind the
stand-in, meeting in a file:// directory: hf:// buckets go through Xet storage, which is not stood in for), a launch
that fails part-way, HF_ENDPOINT, and importing without huggingface_hub."""
import os, re, subprocess, sys
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub", minversion="2.4")
from composer_replication.diloco.serverless.hf_jobs import HFJobsExecutor, _JobsHubStandIn

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
ENTRY = "composer_replication.diloco.serverless.replica_entrypoint"


@pytest.fixture
def hub():
    h = _JobsHubStandIn(token="hf_standin", cwd=str(REPO), extra_env={"PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)])})
    try: yield h
    finally: h.close()


def executor(hub, **kw):
    return HFJobsExecutor(endpoint=hub.endpoint, token="hf_standin", install=None, python=sys.executable, poll_interval_s=0.1, **kw)


def test_requests_are_the_jobs_api(hub):
    ex = executor(hub)
    hs = ex.launch_replicas(2, "composer_replication.diloco.serverless.executor._echo_job", {"x": 1}, gpu="h200x2", timeout=120)
    res = ex.collect(hs, timeout=120)
    assert [r["result"] for r in res] == [{"rank": 0, "x": 1}, {"rank": 1, "x": 1}]
    ids = [h.metadata["job_id"] for h in hs]
    paths = {p for _, p in hub.requests}
    assert hub.requests[0] == ("GET", "/api/whoami-v2") and hub.requests.count(("GET", "/api/whoami-v2")) == 1
    assert [r for r in hub.requests if r[0] == "POST"] == [("POST", "/api/jobs/tester")] * 2
    for i in ids: assert f"/api/jobs/tester/{i}" in paths and f"/api/jobs/tester/{i}/logs" in paths
    assert all(re.fullmatch(r"/api/(whoami-v2|jobs/tester(/\w+(/logs)?)?)", p) for p in paths), paths  # nothing else was called
    spec = hub.jobs[ids[1]]["spec"]
    assert (spec["flavor"], spec["timeoutSeconds"], spec["environment"]["REPLICA_RANK"], spec["environment"]["WORLD_SIZE"]) == ("h200x2", 120, "1", "2")
    assert spec["command"][:3] == [sys.executable, "-m", "composer_replication.diloco.serverless.hf_jobs"]
    assert spec["labels"]["composer-launch"] == hs[0].metadata["launch"] and spec["labels"]["name"].endswith("rank1")


def test_diloco_round_through_hf_jobs(hub, tmp_path):
    "Two jobs run replica_entrypoint.main with the tiny LM and meet in a file:// store: equal weights after every sync."
    ex = executor(hub)
    kw = {"steps": 4, "sync_every": 2, "use_bucketization": True, "return_params": False}
    hs = ex.launch_replicas(2, ENTRY, {"rendezvous_uri": f"file://{tmp_path}/rdv", "world_size": 2, "trainer_module": ENTRY,
                                       "trainer_fn": "train_tiny_replica", "trainer_kwargs": kw,
                                       "store_kwargs": {"poll_interval_s": 0.05, "timeout_s": 300}}, timeout=600)
    try: res = ex.collect(hs, timeout=600)
    finally:
        for h in hs: ex.cancel(h)
    assert [r["status"] for r in res] == ["succeeded"] * 2, [r["error"] for r in res]
    a, b = res[0]["result"], res[1]["result"]
    assert (a["rank"], b["rank"], a["sync_steps"], a["manager_step"], a["rounds"]) == (0, 1, [2, 4], 2, 2)
    assert a["sync_digests"] == b["sync_digests"] and a["final_digest"] == b["final_digest"] and a["losses"] != b["losses"]


def test_crashed_job_fails_and_peer_times_out(hub, tmp_path):
    "A replica job that dies before its first sync is failed (the Hub's message and log tail); its peer's TimeoutError names it."
    ex = executor(hub)
    hs = ex.launch_replicas(2, ENTRY, {"rendezvous_uri": str(tmp_path / "rdv"), "world_size": 2, "trainer_module": "diloco_helpers",
                                       "trainer_fn": "linear_trainer", "trainer_kwargs": {"crash_rank": 1, "crash_at": 2},
                                       "store_kwargs": {"timeout_s": 5, "poll_interval_s": 0.05}}, timeout=300)
    r0, r1 = ex.collect(hs, timeout=300)
    assert r1["status"] == "failed" and "exit code: 9" in r1["error"], r1
    assert r0["status"] == "failed" and "TimeoutError" in r0["error"] and "rank(s) [1]" in r0["error"], r0["error"]


def test_partial_launch_cancels_started_jobs(hub):
    hub.max_jobs = 1
    ex = executor(hub)
    from huggingface_hub.errors import HfHubHTTPError
    with pytest.raises(HfHubHTTPError, match="429|quota"):
        ex.launch_replicas(2, "composer_replication.diloco.serverless.executor._sleeping_job", {"seconds": 60})
    [job] = hub.jobs.values()
    assert job["cancelled"] and job["proc"].poll() is not None  # the first job was cancelled, not left running
    assert ("POST", f"/api/jobs/tester/{job['id']}/cancel") in hub.requests


def test_hf_endpoint_environment_and_missing_dependency():
    code = "from composer_replication.diloco.serverless.hf_jobs import HFJobsExecutor; print(HFJobsExecutor(token='hf_x').api.endpoint)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env={**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert r.stdout.strip() == "http://127.0.0.1:9", r.stderr[-2000:]
    code = ("import sys; sys.modules['huggingface_hub'] = None\n"
            "from composer_replication.diloco.serverless.hf_jobs import HFJobsExecutor\n"
            "try: HFJobsExecutor()\nexcept RuntimeError as e: print(e)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert "pip install composer-replication[hf]" in r.stdout, r.stderr[-2000:]
