"""TRL's `DPOTrainer` trains, unchanged, on the preference dataset `composer-replication pairs --trl DIR` writes.

The dataset is read with `datasets.load_dataset(DIR)`; the tiny model's chat template renders tools and tool calls, so the
tool-calling turns of the pairs reach the tokens TRL trains on.
"""
from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from composer_replication.cli import main  # noqa: E402
from composer_replication.cli_stages import TRL_COLUMNS  # noqa: E402
from composer_replication.sample import SAMPLE_FIXES, SAMPLE_SESSION, SCRIPTED_TEACHERS, scripted_actions, scripted_policies  # noqa: E402
from composer_replication.teacher_server import TeacherServer  # noqa: E402


def run_cli(*argv):
    with contextlib.redirect_stdout(io.StringIO()) as o, contextlib.redirect_stderr(io.StringIO()) as e:
        rc = main([str(a) for a in argv])
    assert rc == 0, (argv, o.getvalue(), e.getvalue())
    return o.getvalue()


@pytest.fixture(scope="module")
def trl_dir(tmp_path_factory):
    "ingest -> replay (three scripted teachers on a loopback server) -> pairs --trl."
    d = tmp_path_factory.mktemp("stages")
    run_cli("ingest", SAMPLE_SESSION, "--out", d/"states.jsonl", "--quiet")
    states = [json.loads(l) for l in (d/"states.jsonl").read_text().splitlines()]
    with TeacherServer(scripted_policies(states, scripted_actions(states, SAMPLE_FIXES))) as srv:
        spec = ",".join([srv.url] + [f"{t['slug']}@{t['input_per_mtok']}/{t['output_per_mtok']}" for t in SCRIPTED_TEACHERS])
        run_cli("replay", d/"states.jsonl", "--teachers", spec, "--max-usd", "1", "--out", d/"rep", "--quiet")
    run_cli("pairs", d/"rep", "--out", d/"pairs.jsonl", "--trl", d/"trl")
    return d/"trl"


def states_tools(trl_dir):
    "The tool schemas the ingested states carry (every state of the sample session the same list)."
    return json.loads((trl_dir.parent/"states.jsonl").read_text().splitlines()[0])["tools"]


def test_load_dataset_reads_trl_columns(trl_dir):
    from trl.data_utils import is_conversational
    ds = datasets.load_dataset(str(trl_dir), split="train")
    assert sorted(ds.column_names) == sorted(TRL_COLUMNS) and len(ds) == 2
    ex = ds[0]
    assert is_conversational(ex)                                   # TRL takes the conversational path
    assert [m["role"] for m in ex["chosen"]] == ["assistant"] and [m["role"] for m in ex["rejected"]] == ["assistant"]
    call = ex["chosen"][0]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "Edit"
    assert json.loads(call["function"]["arguments"])["new_string"] == "    return a + b"
    assert any(m["role"] == "tool" for m in ex["prompt"]) and all(isinstance(m["content"], str) for m in ex["prompt"])
    tools = json.loads(ex["tools"])                                # DPOTrainer json.loads a string `tools` itself
    assert {"Edit", "Read", "Bash"} <= {t["function"]["name"] for t in tools}
    assert all(t["type"] == "function" and t["function"].get("parameters", {"type": "object"})["type"] == "object" for t in tools)
    assert tools == json.loads(json.dumps(states_tools(trl_dir)))    # the tools the states carry: the ones the collator renders


def test_dpo_trainer_trains_on_it(trl_dir, tmp_path):
    from trl import DPOConfig, DPOTrainer
    from composer_replication.tiny import tiny_causal_lm, tiny_tokenizer
    tok = tiny_tokenizer()
    ds = datasets.load_dataset(str(trl_dir), split="train")
    args = DPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=1, learning_rate=1e-3, logging_steps=1,
                     report_to=[], use_cpu=True, save_strategy="no", max_length=None, bf16=False, disable_tqdm=True, seed=0)
    # the reference: the same initial weights (TRL would reload it from the model's hub id, which a model built from a config has not)
    tr = DPOTrainer(model=tiny_causal_lm(), ref_model=tiny_causal_lm(), args=args, train_dataset=ds, processing_class=tok)
    row = tr.train_dataset[0]
    text = tok.decode(row["prompt_ids"] + row["chosen_ids"])
    assert "# Tools" in text and '"name": "Edit"' in text           # the tools column reached the template
    assert "<tool_call>" in tok.decode(row["chosen_ids"]) and "<tool_response>" in text   # so did the tool calls and results
    tr.train()
    losses = [l["loss"] for l in tr.state.log_history if "loss" in l]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses
