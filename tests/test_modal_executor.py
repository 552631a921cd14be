"""ModalExecutor against a fake of the Modal SDK objects it calls (Modal's control plane cannot be stood in for): the
fake's method signatures are compared with the installed `modal`, so it cannot drift; a DiLoCo round between two fake
calls (local processes running the real replica body); a spawn failing part-way; importing without modal."""
import inspect, os, subprocess, sys
from pathlib import Path

import pytest

modal = pytest.importorskip("modal", minversion="1.6")
from composer_replication.diloco.serverless import modal as M

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
ENTRY = "composer_replication.diloco.serverless.replica_entrypoint"
LOGS = type(modal.FunctionCall.logs.fget(object.__new__(modal.FunctionCall)))

PAIRS = {"Function.from_name": (M._FakeModalFunction.from_name, modal.Function.from_name),
         "Function.with_options": (M._FakeModalFunction.with_options, modal.Function.with_options),
         "Function.spawn": (M._FakeModalFunction.spawn, modal.Function.spawn),
         "FunctionCall.get": (M._FakeFunctionCall.get, modal.FunctionCall.get),
         "FunctionCall.cancel": (M._FakeFunctionCall.cancel, modal.FunctionCall.cancel),
         "FunctionCall.logs.tail": (M._FakeLogs.tail, LOGS.tail)}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_fake_matches_installed_sdk(name):
    fake, real = PAIRS[name]
    assert M._signature_drift(fake, real) == [], name


def test_executor_uses_only_the_faked_surface():
    "Every attribute the executor calls on a function or call object exists on the real SDK classes (and on the fakes)."
    src = inspect.getsource(M.ModalExecutor)
    for a in ("with_options", "spawn"): assert f".{a}(" in src and hasattr(modal.Function, a) and hasattr(M._FakeModalFunction, a)
    for a in ("get", "cancel", "object_id", "logs"):
        assert f".{a}" in src and hasattr(modal.FunctionCall, a) and hasattr(M._FakeFunctionCall, a)
    assert hasattr(LOGS, "tail") and hasattr(modal.exception, "FunctionTimeoutError") and hasattr(modal.exception, "OutputExpiredError")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(REPO)]))  # the fake's processes import diloco_helpers
    f = M._FakeModalFunction(workdir=str(tmp_path / "calls"))
    os.makedirs(f.workdir)
    yield f
    for c in f.calls: c["call"]._kill()


def test_diloco_round_through_modal_fake(fake, tmp_path):
    ex = M.ModalExecutor(function=fake, poll_interval_s=0.1)
    hs = ex.launch_replicas(2, ENTRY, {"rendezvous_uri": str(tmp_path / "rdv"), "world_size": 2, "trainer_module": "diloco_helpers",
                                       "trainer_fn": "linear_trainer", "store_kwargs": {"timeout_s": 60, "poll_interval_s": 0.02}},
                            gpu="H100", timeout=300)
    r0, r1 = ex.collect(hs, timeout=300)
    assert (r0["status"], r1["status"]) == ("succeeded", "succeeded"), (r0["error"], r1["error"])
    import torch
    for n in r0["result"]: assert torch.equal(r0["result"][n], r1["result"][n])  # tensors come back pickled, as Modal returns them
    assert [c["args"][2:] for c in fake.calls] == [(0, "REPLICA_RANK", 2), (1, "REPLICA_RANK", 2)]
    assert {(c["options"]["gpu"], c["options"]["timeout"]) for c in fake.calls} == {("H100", 300)}


def test_spawn_failure_cancels_spawned_calls(fake):
    class Flaky(M._FakeModalFunction):
        def spawn(self, *args, **kwargs):
            if args[2] == 1: raise ConnectionError("modal control plane unreachable")
            return super().spawn(*args, **kwargs)
    flaky = Flaky(workdir=fake.workdir, calls=fake.calls)
    ex = M.ModalExecutor(function=flaky, poll_interval_s=0.1)
    with pytest.raises(ConnectionError, match="unreachable"):
        ex.launch_replicas(2, "composer_replication.diloco.serverless.executor._sleeping_job", {"seconds": 60})
    [c] = fake.calls
    assert c["call"]._cancelled and c["call"]._proc.poll() is not None


def test_imports_without_modal():
    code = ("import sys; sys.modules['modal'] = None\n"
            "from composer_replication.diloco.serverless.modal import ModalExecutor\n"
            "try: ModalExecutor()\nexcept RuntimeError as e: print(e)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert "pip install composer-replication[modal]" in r.stdout, r.stderr[-2000:]
