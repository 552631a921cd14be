"""The remote backends (HF Jobs, Modal) name an entry point the same way, through `executor.entrypoint_path`: every kind
of entry point reaches the remote side as the same string or is refused with the same error type and message (up to
who imports it). The backends' clients are replaced by recorders, so nothing is started and nothing is sent."""
import json
import subprocess
from types import SimpleNamespace

import pytest

pytest.importorskip("huggingface_hub", minversion="2.4")
pytest.importorskip("modal", minversion="1.6")
from composer_replication.diloco.serverless.executor import entrypoint_path
from composer_replication.diloco.serverless.hf_jobs import HFJobsExecutor
from composer_replication.diloco.serverless.modal import ModalExecutor


class _Calls:
    "Stands in for a `modal.Function`: records what `spawn` sent."
    def __init__(self): self.sent = []
    def with_options(self, **kw): return self
    def spawn(self, entrypoint, *args, **kw):
        self.sent.append(entrypoint); return SimpleNamespace(object_id=f"fc-{len(self.sent)}")


def hf_sent(entrypoint):
    "The entry point string an HF job's command would carry."
    ex = HFJobsExecutor(endpoint="http://127.0.0.1:9", token="hf_unused", namespace="tester", install=None)
    sent = []
    def run_job(*, command, **kw): sent.append(command[3]); return SimpleNamespace(id=f"job{len(sent)}", url=None)
    ex.api.run_job = run_job
    ex.launch_replicas(1, entrypoint, {})
    return sent[0]


def modal_sent(entrypoint):
    "The entry point string a Modal call would carry."
    fn = _Calls()
    ModalExecutor(function=fn).launch_replicas(1, entrypoint, {})
    return fn.sent[0]


def _nested():
    def inner(): return 1
    return inner


ENTRYPOINTS = {"module path": "composer_replication.diloco.serverless.replica_entrypoint", "module:function": "json:dumps",
               "function": subprocess.run, "blank": "", "spaces": "   ", "lambda": lambda: 1, "nested": _nested(),
               "method": json.JSONEncoder.encode, "number": 3}
WHERE = {"hf": "a remote job", "modal": "a Modal container"}


def outcome(send, entrypoint, where):
    "('sent', string) or (error type, message with the backend's own words replaced)."
    try: return ("sent", send(entrypoint))
    except (TypeError, ValueError) as e: return (type(e).__name__, str(e).replace(where, "<where>"))


@pytest.mark.parametrize("name", sorted(ENTRYPOINTS))
def test_backends_name_entrypoints_alike(name):
    ep = ENTRYPOINTS[name]
    hf, modal = outcome(hf_sent, ep, WHERE["hf"]), outcome(modal_sent, ep, WHERE["modal"])
    assert hf == modal, (name, hf, modal)
    assert hf == outcome(lambda e: entrypoint_path(e, WHERE["hf"]), ep, WHERE["hf"])   # ... and both are `entrypoint_path`


def test_blank_entrypoint_is_a_value_error_naming_it():
    for send in (hf_sent, modal_sent):
        with pytest.raises(ValueError, match="entrypoint is a blank string"): send("  ")
    assert outcome(hf_sent, subprocess.run, "")[1] == "subprocess:run"
