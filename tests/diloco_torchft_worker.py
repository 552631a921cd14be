"""One torchft replica group (one process) training the tiny LM with DiLoCo; used by tests/test_diloco_torchft.py.

It owns its TCPStore, builds `Manager(pg=ProcessGroupGloo(...), hostname="127.0.0.1", use_async_quorum=False)` from the
env (TORCHFT_LIGHTHOUSE, MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), trains with `make_diloco_outer_loop`, and appends
one JSON line per sync to --status-file: the manager step, whether the round committed, the participants, a weights digest.
torchft's own servers bind every interface by default; here they are pinned to the loopback interface.
"""
import argparse, hashlib, json, os, sys, time
from datetime import timedelta
from http.server import ThreadingHTTPServer

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo pairs over loopback only

import torch
import torchft.checkpointing.http_transport as http_transport
import torchft.manager as torchft_manager
from torch.distributed import TCPStore
from torchft import Manager, ProcessGroupGloo

from composer_replication.diloco import make_diloco_outer_loop
from composer_replication.tiny import tiny_causal_lm


class _LoopbackHTTPServer(ThreadingHTTPServer):
    "torchft's checkpoint server, bound to 127.0.0.1 instead of every interface."
    request_queue_size = 1024
    def __init__(self, _addr, handler): super().__init__(("127.0.0.1", 0), handler)

class LoopbackHTTPTransport(http_transport.HTTPTransport):
    "HTTP checkpoint transport that advertises 127.0.0.1 (torchft advertises socket.gethostname())."
    def address(self) -> str: return f"http://127.0.0.1:{self._server.socket.getsockname()[1]}/checkpoint/"

http_transport._IPv6HTTPServer = _LoopbackHTTPServer
_ManagerServer = torchft_manager.ManagerServer
def _loopback_manager_server(*args, bind, **kwargs): return _ManagerServer(*args, bind=bind.replace("[::]", "127.0.0.1"), **kwargs)
torchft_manager.ManagerServer = _loopback_manager_server


def digest(model) -> str:
    h = hashlib.sha256()
    for n, p in model.named_parameters(): h.update(n.encode()); h.update(p.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replica-id", required=True)
    ap.add_argument("--status-file", required=True)
    ap.add_argument("--seed", type=int, default=0, help="model init seed (a different one proves healing copies a peer's weights)")
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--sync-every", type=int, default=4)
    ap.add_argument("--step-sleep", type=float, default=0.02)
    a = ap.parse_args()
    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=True, wait_for_workers=False)  # this group's own store
    model = tiny_causal_lm(vocab_size=128, seed=a.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    def state_dict(): return {"model": model.state_dict(), "optim": opt.state_dict()}
    def load_state_dict(sd): model.load_state_dict(sd["model"]); opt.load_state_dict(sd["optim"])
    t = timedelta(seconds=10)
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=5)), load_state_dict=load_state_dict, state_dict=state_dict,
                      min_replica_size=1, use_async_quorum=False, replica_id=a.replica_id, hostname="127.0.0.1",
                      timeout=t, quorum_timeout=timedelta(seconds=60), connect_timeout=t,
                      checkpoint_transport=LoopbackHTTPTransport(timeout=t, num_chunks=0))
    commits = []  # what should_commit answered at each sync (DiLoCo calls it once per fragment sync)
    should_commit = manager.should_commit
    def recording_should_commit(*args, **kwargs):
        r = should_commit(*args, **kwargs); commits.append(r); return r
    manager.should_commit = recording_should_commit
    g = torch.Generator().manual_seed(1000 + a.seed)
    log = open(a.status_file, "a", buffering=1)
    log.write(json.dumps({"event": "started", "replica": a.replica_id, "pid": os.getpid(), "digest": digest(model)}) + "\n")
    with make_diloco_outer_loop(manager, [model], opt, sync_every=a.sync_every, outer_lr=0.7, outer_momentum=0.9):
        for step in range(1, a.steps + 1):
            s = torch.randint(0, 128, (4, 1), generator=g); ids = (s + torch.randint(1, 5, (4, 1), generator=g) * torch.arange(16)) % 128
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad(); loss.backward()
            n_commits = len(commits)
            opt.step()  # DiLoCo syncs inside every sync_every steps
            if step % a.sync_every == 0:
                log.write(json.dumps({"event": "sync", "replica": a.replica_id, "inner_step": step, "manager_step": manager.current_step(),
                                      "committed": len(commits) > n_commits and commits[-1], "participants": manager.num_participants(),
                                      "loss": loss.item(), "digest": digest(model), "t": time.time()}) + "\n")
            time.sleep(a.step_sleep)
    manager.shutdown(wait=False)


if __name__ == "__main__":
    sys.exit(main())
