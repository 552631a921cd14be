"""Check on the real sessions: both sides of a DPO pair share one prompt, and keep the tool result the action answers.

At every assistant turn of the real fixture sessions that answers a tool result, a pair (the recorded action vs a short
`Bash ls`) is rendered by `shared_prompt_sides` at 1,024 and 2,048 tokens with SmolLM2's tokenizer and the session's tools:
how many pairs are dropped (a response alone too long, or no cut that fits), how many share their prompt token for token,
and how many prompts still hold the end of the tool result the action answers.

    python benchmarks/dpo_shared_prompt.py
"""
from collections import Counter
from pathlib import Path
from transformers import AutoTokenizer
from composer_replication.models import smollm2_dir, smollm2_chat_template
from composer_replication.trainer.data_collator import trace_examples_from_session
from composer_replication.trainer.messages import messages_from_turns, tokenize_conversation
from composer_replication.trainer.windows import shared_prompt_sides
tok = AutoTokenizer.from_pretrained(smollm2_dir()); tok.chat_template = smollm2_chat_template()
exs = [e for f in (Path("../shared/fixtures/claude_code"), Path("tests/fixtures/claude_code")) for p in sorted(f.iterdir())
       if p.name != "SOURCES.md" and not p.name.startswith("07_") for e in trace_examples_from_session(p)]
short = {"role": "assistant", "content": "", "tool_calls": [{"id": "x", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]}
for L in (1024, 2048):
    st, n, same, answered, dropped = Counter(), 0, 0, 0, 0
    for e in exs:
        msgs = messages_from_turns(e["turns"])
        for k, m in enumerate(msgs):
            if m["role"] != "assistant" or k < 2 or msgs[k-1]["role"] != "tool": continue
            prompt = msgs[:k]; n += 1
            r = shared_prompt_sides(tok, prompt, [m, short], L, e.get("tools"), st)
            if r is None: dropped += 1; continue
            (ci, cm), (ri, rm) = r
            same += ci[:cm.index(1)] == ri[:rm.index(1)]
            text = tok.decode(ci[:cm.index(1)])
            answered += prompt[-1]["content"][-40:] in text
    print(f"L={L}: {n} pair states (real action vs a short one), {dropped} dropped (response too long), shared prompt identical {same}/{n-dropped}, "
          f"answered tool result's end kept {answered}/{n-dropped}; {dict(st)}")
