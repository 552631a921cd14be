"""One training run for tests/test_ddp.py: launched by torchrun / accelerate launch (2 processes, gloo) or as one plain process.

Writes (rank 0 only) a JSON file: the logged per-step channels and the final trainable weights, for the test to compare."""
import argparse, importlib.resources, json, logging, os, warnings
from pathlib import Path

import torch


def sample_examples():
    "The sample session's trace with two DPO pairs (as in nbs/21), as TraceExamples."
    from composer_replication.ingestion.claude_code import ClaudeCodeIngester
    from composer_replication.trainer.data_collator import trace_examples_from_states
    sample = Path(importlib.resources.files("composer_replication"))/"assets/sample_session/demo-calc-fix.jsonl"
    states = list(ClaudeCodeIngester().ingest(sample))
    fixes = {2: '[TOOL_USE] name=Edit input={"file_path": "/home/user/calc/calc/core.py", "new_string": "    return a + b", "old_string": "    return a - b"}',
             6: '[TOOL_USE] name=Read input={"file_path": "/home/user/calc/tests/test_calc.py"}'}
    pairs = [{"state_id": states[i]["state_id"], "state_messages": states[i]["messages"], "chosen": a,
              "rejected": states[i]["student_action"], "n_teachers_agreeing": 3} for i, a in fixes.items()]
    return trace_examples_from_states(states, pairs=pairs, final_reward=1.0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trainer", choices=["offline", "grpo"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, required=True, help="per-process batch (offline: rows; grpo: completions; and trace batch)")
    p.add_argument("--ga", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lora", action="store_true")
    p.add_argument("--chunk", type=int, default=None)
    a = p.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR); warnings.filterwarnings("ignore")
    torch.use_deterministic_algorithms(True)
    from composer_replication.hint_generator import dispatch
    from composer_replication.loss import LossConfig
    from composer_replication.tiny import tiny_causal_lm, tiny_tokenizer
    from composer_replication.trainer import ComposerOfflineTrainer, ComposerReplicationTrainer
    from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator
    tok = tiny_tokenizer()
    collator = ComposerDataCollator(tok, CollatorConfig(pad_token_id=tok.pad_token_id, hint_generator=dispatch, max_seq_len=1024, max_dpo_seq_len=512))
    examples = collator.windows(sample_examples())   # several windows: the channels' counts differ from row to row
    model = tiny_causal_lm(seed=3)
    if a.trainer == "grpo" and not a.lora:   # TRL loads GRPO's KL reference from the model's folder: give the tiny model one
        from transformers import AutoModelForCausalLM
        folder = os.path.join(os.path.dirname(a.out), f"tiny-{os.environ.get('RANK', '0')}")
        model.save_pretrained(folder); model = AutoModelForCausalLM.from_pretrained(folder)
    if a.lora:
        from composer_replication.models import add_lora
        torch.manual_seed(0)   # the adapters' random init (DDP would broadcast rank 0's anyway; the one-process run must draw the same)
        model = add_lora(model, dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"],
                                     init_lora_weights=False))   # non-zero B: the adapted model differs from the reference; add_lora's layers
    loss = LossConfig(alpha_sdpo=0.5, beta_replay=0.5, chunk_size=a.chunk)
    common = dict(output_dir=os.path.join(os.path.dirname(a.out), "run"), max_steps=a.steps, learning_rate=1e-3, logging_steps=1,
                  report_to=[], save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True, gradient_accumulation_steps=a.ga,
                  lr_scheduler_type="constant", optim="sgd")
    if a.trainer == "offline":
        from transformers import TrainingArguments
        args = TrainingArguments(per_device_train_batch_size=a.batch, train_sampling_strategy="sequential", **common)
        tr = ComposerOfflineTrainer(model, args, train_dataset=examples * 8, data_collator=collator, loss_config=loss)
    else:
        from datasets import Dataset
        from trl import GRPOConfig
        prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Run the tests of module {i}."}]} for i in range(16)])
        def reward(completions, **kw): return [len(c[0]["content"]) / 32 for c in completions]
        args = GRPOConfig(per_device_train_batch_size=a.batch, num_generations=2, max_completion_length=6, bf16=False,
                          gradient_checkpointing=False, generation_kwargs={"do_sample": False}, shuffle_dataset=False, beta=0.1, **common)
        tr = ComposerReplicationTrainer(model=model, reward_funcs=reward, args=args, train_dataset=prompts, processing_class=tok,
                                        trace_dataset=examples, data_collator=collator, trace_batch_size=a.batch, loss_config=loss)
    tr.train()
    logs = [{k: v for k, v in l.items() if k.startswith("composer/") or k == "loss"} for l in tr.state.log_history if "loss" in l]
    inner = tr.accelerator.unwrap_model(tr.model)
    weights = {n: p.detach().double().flatten().tolist() for n, p in inner.named_parameters() if p.requires_grad}
    if tr.is_world_process_zero():
        Path(a.out).write_text(json.dumps({"world": tr.accelerator.num_processes, "logs": logs, "weights": weights,
                                           "reference": tr.reference, "fused_lora_layers": sum(type(m).__name__ == "FusedLoraLinear" for m in inner.modules()),
                                           "distributed": str(tr.accelerator.distributed_type), "wrapped": type(tr.model_wrapped).__name__}))


if __name__ == "__main__":
    main()
