"""FSDP2 (torch's fully_shard) on CPU, 2 gloo processes, for tests/test_ddp.py: the three-channel loss run as the sharded root's forward
(trainer.channels.run_as_forward, as the trainers run it), each channel weighted by its global count, a few SGD steps; the gathered weights
and the global channel values are compared with one process over the same rows. (accelerate itself does not shard on a CPU, so the
trainers cannot be launched under FSDP here: this exercises the loss path FSDP runs on GPUs.)"""
import argparse, json, os, sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from ddp_worker import sample_examples  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True); p.add_argument("--chunk", type=int, default=None); p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    torch.use_deterministic_algorithms(True)
    from composer_replication.hint_generator import dispatch
    from composer_replication.loss import LossConfig, compose_loss
    from composer_replication.tiny import tiny_causal_lm, tiny_tokenizer
    from composer_replication.trainer.channels import run_as_forward
    from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator, precompute_ref_logprobs
    world = int(os.environ.get("WORLD_SIZE", "1")); rank = int(os.environ.get("RANK", "0"))
    tok = tiny_tokenizer()
    col = ComposerDataCollator(tok, CollatorConfig(pad_token_id=tok.pad_token_id, hint_generator=dispatch, max_seq_len=1024, max_dpo_seq_len=512))
    rows = col.windows(sample_examples())
    picked = [rows[2], rows[4]]            # both with SDPO targets and a pair: under FSDP every process runs the same forwards
    mine = picked if world == 1 else [picked[rank]]
    model, ref = tiny_causal_lm(seed=3), tiny_causal_lm(seed=3).eval()
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (world,))
        for layer in model.model.layers: fully_shard(layer, mesh=mesh)   # each decoder layer its own unit
        fully_shard(model, mesh=mesh)                                     # the root: embeddings, (tied) LM head, final norm
    cfg = LossConfig(alpha_sdpo=0.5, beta_replay=0.5, chunk_size=a.chunk)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    batch = precompute_ref_logprobs(ref, col(mine), chunk_size=a.chunk)
    def counts(b):
        return torch.tensor([float((b["response_mask"][:, 1:] != 0).sum()), float((b["sdpo_loss_mask"] != 0).sum()),
                             float(b["dpo_chosen_input_ids"].shape[0])], dtype=torch.float64)
    local = counts(batch); total = local.clone()
    if world > 1: dist.all_reduce(total)
    share = local / total * world           # FSDP (like DDP) averages the gradients over processes
    logs = []
    for _ in range(a.steps):
        c = run_as_forward(model, model, lambda: compose_loss(model, batch, cfg))
        parts = torch.stack([c.lm_ce, c.sdpo_jsd, c.trace_replay_dpo]) * share.float()
        loss = parts[0] + 0.5 * parts[1] + 0.5 * parts[2]
        opt.zero_grad(); loss.backward(); opt.step()
        val = parts.detach().double() / world
        if world > 1: dist.all_reduce(val)
        logs.append(val.tolist())
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t
    weights = {n: full(p.detach()).double().flatten().tolist() for n, p in model.named_parameters()}
    sharded = any(hasattr(p, "full_tensor") for p in model.parameters())
    if rank == 0: Path(a.out).write_text(json.dumps({"world": world, "logs": logs, "weights": weights, "sharded": sharded}))
    if world > 1: dist.destroy_process_group()


if __name__ == "__main__":
    main()
