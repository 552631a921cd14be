"""One rendering of a tool call (issue 21, point 5): the same action is the same tokens as a training row's target, a DPO side,
the evaluator's scored right answer and distractor (which the behaviour report also uses), and a row of the TRL export rendered
by the chat template the way TRL's DPOTrainer renders it."""
import json

import pytest

from composer_replication.cli_stages import trl_preference_rows
from composer_replication.evaluation import _encode, _reply_text
from composer_replication.ingestion.core import action_to_message
from composer_replication.task_suite import load_expected, make_task_suite, suite_ingester
from composer_replication.tiny import tiny_tokenizer
from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator, trace_examples_from_states
from composer_replication.trainer.messages import render_conversation


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    d = tmp_path_factory.mktemp("suite")
    make_task_suite(d, 4, 1, seed=3)
    states = list(suite_ingester(d/"train").ingest(d/"train"/"sessions"))
    rows = {r["state_id"]: r for r in load_expected(d/"train")}
    k = next(i for i, s in enumerate(states) if rows[s["state_id"]]["error_recovery"] and rows[s["state_id"]]["distractor"] != rows[s["state_id"]]["action"])
    return states, rows, k


def _turn_tokens(ids, mask):
    return [t for t, m in zip(ids.tolist(), mask.tolist()) if m]


def test_the_same_action_is_the_same_tokens_everywhere(suite):
    states, rows, k = suite
    tok = tiny_tokenizer()
    st, row = states[k], rows[states[k]["state_id"]]
    assert st["tools"] and any(m.get("tool_calls") for m in st["messages"])
    coll = ComposerDataCollator(tok, CollatorConfig(max_seq_len=8192, max_dpo_seq_len=8192, windows=False))
    for action in (row["action"], row["distractor"]):
        # a training row whose last turn is the action (the state's history, then the action)
        ex = trace_examples_from_states([{**st, "student_action": action, "action": None}])[0]
        b = coll([ex])
        train = _turn_tokens(b["input_ids"][0], b["response_mask"][0])   # every assistant turn; the action is the last
        # a DPO side (the behaviour report's margins score these rows)
        pair = {"state_id": st["state_id"], "state_messages": st["messages"], "chosen": action, "rejected": "Done.", "n_teachers_agreeing": 2}
        bp = coll([{**trace_examples_from_states([st])[0], "dpo_pairs": [pair]}])
        dpo = _turn_tokens(bp["dpo_chosen_input_ids"][0], bp["dpo_chosen_response_mask"][0])
        assert train[-len(dpo):] == dpo and len(dpo) > 5
        # the evaluator's scored continuation (right answer and distractor; the behaviour report's next actions use it too)
        prompt_p = render_conversation(tok, st["messages"], add_generation_prompt=True, tools=st["tools"], protect=True)
        pre, seg = _reply_text(tok, st["messages"], action, prompt_p, st["tools"])
        assert pre == prompt_p and _encode(tok, seg) == dpo
        # the prompt: the DPO side's prompt tokens are the evaluator's, tools included
        p = bp["dpo_chosen_response_mask"][0].tolist().index(1)
        assert bp["dpo_chosen_input_ids"][0][:p].tolist() == _encode(tok, prompt_p)
        # the TRL export, rendered by the template as TRL does (dict tools, the prompt, then prompt + chosen)
        trl = trl_preference_rows([pair], [st])[0]
        tools = json.loads(trl["tools"])
        assert tools == st["tools"]
        p_text = tok.apply_chat_template(trl["prompt"], tools=tools, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(trl["prompt"] + trl["chosen"], tools=tools, tokenize=False)
        assert p_text == render_conversation(tok, st["messages"], add_generation_prompt=True, tools=st["tools"])
        assert full.startswith(p_text)
        cont = full[len(p_text):]
        assert tok(cont[:cont.index(tok.eos_token) + len(tok.eos_token)], add_special_tokens=False)["input_ids"] == dpo
