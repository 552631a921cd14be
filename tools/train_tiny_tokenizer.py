"""Train the project's tiny byte-level BPE tokenizer and write it into the package.

    python tools/train_tiny_tokenizer.py            # rewrites composer_replication/assets/tiny_tokenizer/
    python tools/train_tiny_tokenizer.py --check    # exit 1 if the shipped files differ from a fresh training

The corpus is generated here from templates the project owns (coding-agent chat, shell commands,
Python, JSON tool calls), so training is deterministic and needs no download. The chat template is
ChatML in the style of Qwen2.5: system/user/assistant/tool roles, `<tool_call>` JSON blocks, tool
results grouped under a user turn in `<tool_response>` blocks, and -- like real templates -- no
`{% generation %}` markers.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

VOCAB_SIZE = 1024
BOS, EOS, PAD = "<|bos|>", "<|im_end|>", "<|endoftext|>"
SPECIAL = [PAD, BOS, "<|im_start|>", EOS]
# Added, non-special tokens: atomic, but kept by decode(skip_special_tokens=True) like Qwen's.
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Function signatures:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\nReturn each call as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>.<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_WORDS = ("the a file test function error fix run build import class return value list dict path "
          "module package install check read write edit search grep line code bug issue tool call "
          "result output input user assistant system model loss token batch train step data "
          "config json python shell command directory repo branch commit diff patch").split()
_TOOLS = ["Read", "Write", "Edit", "Bash", "Grep", "Glob", "Task", "TodoWrite", "WebFetch"]
_CODE = [
    "def {w}_{v}(x, y=None):\n    return x if y is None else x + y\n",
    "import os\nimport sys\nfrom pathlib import Path\n\nprint(Path('{w}').exists())\n",
    "class {W}{V}:\n    def __init__(self, {w}):\n        self.{w} = {w}\n",
    "for i in range(10):\n    if i % 2 == 0:\n        continue\n    {w}.append(i)\n",
    "try:\n    {w} = json.loads(text)\nexcept ValueError as e:\n    raise RuntimeError(str(e))\n",
    "Traceback (most recent call last):\n  File \"{w}.py\", line 12, in <module>\nKeyError: '{v}'\n",
    "$ pytest tests/test_{w}.py -q\n3 passed, 1 failed in 0.42s\n",
    "$ git diff --stat\n {w}/{v}.py | 4 ++--\n 1 file changed, 2 insertions(+), 2 deletions(-)\n",
    "<tool_use_error>InputValidationError: {W} failed: the required parameter `{v}` is missing</tool_use_error>\n",
]


def corpus():
    "Yield the training texts: deterministic, owned by the project."
    for i, (w, v) in enumerate(itertools.product(_WORDS, _WORDS[::-3])):
        tool = _TOOLS[i % len(_TOOLS)]
        code = _CODE[i % len(_CODE)].format(w=w, v=v, W=w.title(), V=v.title())
        args = json.dumps({"file_path": f"/repo/src/{w}/{v}.py", "pattern": f"{v}_{w}", "limit": i % 200})
        yield (f"Please {w} the {v} in the repo and run the tests.\n"
               f"I will {v} the {w} first.\n<tool_call>\n{{\"name\": \"{tool}\", \"arguments\": {args}}}\n</tool_call>\n"
               f"<tool_response>\n{code}</tool_response>\n<think>\nThe {w} {v} failed; check the {w}.\n</think>\n"
               f"Done: {code}")


def train(out_dir: Path) -> None:
    "Train the BPE on `corpus()` and save a fast tokenizer with the chat template into `out_dir`."
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers, processors
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   unk_token=None, model_max_length=4096, clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    # Name the class every transformers release knows (5.x writes its new alias `TokenizersBackend`).
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare a fresh training with the shipped files")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "composer_replication/assets/tiny_tokenizer")
    args = ap.parse_args(argv)
    if not args.check:
        train(args.out)
        print(f"wrote {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        train(Path(tmp))
        fresh, shipped = _files(Path(tmp)), _files(args.out)
    if fresh != shipped:
        print(f"shipped tokenizer differs from a fresh training: {sorted(set(fresh) ^ set(shipped)) or [k for k in fresh if fresh[k] != shipped.get(k)]}")
        return 1
    print("shipped tokenizer files reproduce exactly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
