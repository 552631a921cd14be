"""Issue 35, points 6 and 7: tool results matched to their calls by position where they carry no id, and turns longer
than a window trained in parts.

- Point 6: a TraceExample in the API reference's TraceTurn format (an assistant turn's one `tool_call`, tool turns
  without `tool_call_id`) gets the failed call's input and the hindsight solution in its hints, in every stage that
  turns turns into messages (collator, windows' solutions, the suite's error sites, the environments, evaluation).
- Point 7: every assistant token trains exactly once, a turn longer than a window included (a prefix window, then
  continuation windows, each opening with the system prompt and the task); nothing else ever trains.
"""
from collections import Counter

import pytest

from composer_replication.hint_generator import classify_error, dispatch, match_tool_results, tool_calls_of
from composer_replication.tiny import tiny_tokenizer
from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator
from composer_replication.trainer.messages import messages_from_turns, tokenize_conversation
from composer_replication.trainer.windows import part_row, solutions, trace_windows, turn_parts, window_tokens

TOK = tiny_tokenizer()
READ = {"name": "Read", "input": {"file_path": "calc.py"}}
BAD = {"name": "Edit", "input": {"file_path": "calc.py", "old_string": "a - b", "new_string": "a + b"}}
GOOD = {"name": "Edit", "input": {"file_path": "calc.py", "old_string": "a-b", "new_string": "a+b"}}


def ref_trace():
    "A trace in the reference's TraceTurn format: no ids anywhere, one `tool_call` per assistant turn."
    return [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix the sign bug in calc.py."},
            {"role": "assistant", "content": "", "tool_call": READ}, {"role": "tool", "content": "def sub(a, b): return a-b"},
            {"role": "assistant", "content": "", "tool_call": BAD},
            {"role": "tool", "content": "<tool_use_error>String to replace not found in file.</tool_use_error>",
             "tool_error": "<tool_use_error>String to replace not found in file.</tool_use_error>"},
            {"role": "assistant", "content": "", "tool_call": GOOD}, {"role": "tool", "content": "ok"},
            {"role": "assistant", "content": "Fixed."}]


# -- point 6 ---------------------------------------------------------------------------------------------------------

def test_match_by_position_and_by_id():
    t = ref_trace()
    assert match_tool_results(t) == {3: (2, 0), 5: (4, 0), 7: (6, 0)}
    assert tool_calls_of(t[4]) == [BAD] and tool_calls_of(t[5]) == []
    two = [{"role": "assistant", "tool_calls": [{"id": "x", "name": "A"}, {"name": "B"}, {"name": "C"}]},
           {"role": "tool", "content": "b"}, {"role": "tool", "tool_call_id": "x", "content": "a"}, {"role": "tool", "content": "c"}]
    assert match_tool_results(two) == {1: (0, 1), 2: (0, 0), 3: (0, 2)}   # an id wins; the rest in order
    stale = [{"role": "assistant", "tool_calls": [{"id": "x", "name": "A"}]}, {"role": "tool", "tool_call_id": "x", "content": ""},
             {"role": "assistant", "tool_calls": [{"name": "B"}]}, {"role": "tool", "tool_call_id": "nope", "content": ""}]
    assert match_tool_results(stale) == {1: (0, 0), 3: (2, 0)}            # an unknown id: matched by position
    assert match_tool_results([{"role": "tool", "content": ""}, {"role": "tool", "content": ""}]) == {}
    extra = [{"role": "assistant", "tool_call": READ}, {"role": "tool", "content": ""}, {"role": "tool", "content": ""}]
    assert match_tool_results(extra) == {1: (0, 0)}                       # more results than calls: the extra answers nothing


def test_collator_hint_carries_input_and_hindsight_solution():
    seen = []
    def gen(kind, meta): seen.append((kind, meta)); return dispatch(kind, meta)
    c = ComposerDataCollator(TOK, CollatorConfig(max_seq_len=4096, hint_generator=gen, solution_sources=("hindsight",)))
    batch = c([{"trace_id": "ref", "turns": ref_trace()}])
    assert len(seen) == 1
    kind, meta = seen[0]
    assert meta["tool_name"] == "Edit"
    assert meta["tool_input"] == '{"file_path": "calc.py", "old_string": "a - b", "new_string": "a + b"}'
    assert meta["solution"] == 'Edit {"file_path": "calc.py", "old_string": "a-b", "new_string": "a+b"}'
    assert c.stats["sdpo_sites_with_solution"] == 1 and batch["sdpo_loss_mask"].sum() > 0


def test_solutions_and_windows_on_reference_turns():
    msgs = messages_from_turns(ref_trace())
    assert solutions(msgs, sources=("hindsight",)) == {5: 'Edit {"file_path": "calc.py", "old_string": "a-b", "new_string": "a+b"}'}
    long = ref_trace()[:2] + [t for i in range(20) for t in ({"role": "assistant", "content": "", "tool_call": {"name": "Read", "input": {"file_path": f"m{i}.py"}}},
                                                            {"role": "tool", "content": f"x = {i}\n" * 10})] + ref_trace()[2:]
    wins = trace_windows({"turns": long}, tokenizer=TOK, max_seq_len=256)
    err = [t for w in wins for t in w["turns"] if t.get("tool_error")]
    assert err and all(t["error_meta"]["solution"] == solutions(msgs, sources=("hindsight",))[5] for t in err)


def test_repeated_failure_by_position():
    hist = messages_from_turns([{"role": "assistant", "content": "", "tool_call": {"name": "Bash", "input": {"command": "make"}}},
                                {"role": "tool", "content": "Exit code 2", "tool_error": "Exit code 2"}])
    assert classify_error("Exit code 2", tool_name="Bash", tool_input={"command": "make"}, history=hist) == "repeated_failure"


def test_error_sites_and_evaluation_by_position():
    from composer_replication.environments import recorded_calls
    from composer_replication.evaluation import _failing_calls
    from composer_replication.task_suite import error_sites
    msgs = messages_from_turns(ref_trace())
    for m in msgs: m.pop("tool_call_id", None)
    for m in msgs:
        for c in m.get("tool_calls") or []: c.pop("id")   # no ids at all
    sites = error_sites([{"state_id": "s", "messages": msgs[:6]}])
    assert [(s["tool"], s["input"]) for s in sites] == [("Edit", BAD["input"])]
    assert _failing_calls(msgs[:6])["tool_calls"][0]["function"]["name"] == "Edit"
    assert [(n, r) for n, _, r in recorded_calls(msgs)] == [("Read", "def sub(a, b): return a-b"), ("Edit", msgs[5]["content"]), ("Edit", "ok")]


# -- point 7 ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,head,L,ctx,last", [(1000, 50, 200, 40, 990), (300, 10, 64, 0, 299), (120, 100, 110, 3, 119), (80, 5, 100, 10, 70)])
def test_turn_parts_cover_each_position_once(n, head, L, ctx, last):
    parts = turn_parts(n, head, L, ctx, last)
    covered = [t for _, x, y in parts for t in range(x, y)]
    assert covered == list(range(head, parts[-1][2])) and parts[-1][2] > last
    assert all(head + (y - c) <= L and c <= x for c, x, y in parts)


def test_turn_parts_needs_room():
    with pytest.raises(ValueError, match="no room for a slice"): turn_parts(100, 63, 64, 0, 99)
    with pytest.raises(ValueError, match="no room for a slice"): turn_parts(100, 10, 64, 54, 99)


def big_write_trace(n_lines=400):
    big = {"name": "Write", "input": {"file_path": "big.py", "content": "".join(f"value_{i} = {i} * 2\n" for i in range(n_lines))}}
    return ref_trace()[:4] + [{"role": "assistant", "content": "I will write it.", "tool_call": big}, {"role": "tool", "content": "ok"}] + ref_trace()[4:]


def trained_total(turns):
    ids, own = tokenize_conversation(TOK, messages_from_turns(turns))
    return sum(o >= 0 for o in own)


@pytest.mark.parametrize("L", [256, 512])
def test_every_assistant_token_trains_once(L):
    turns = big_write_trace()
    total = trained_total(turns)
    c = ComposerDataCollator(TOK, CollatorConfig(max_seq_len=L, hint_generator=dispatch, cache_size=0))
    wins = c.windows([{"trace_id": "w", "turns": turns}])
    parts = [w for w in wins if "part" in w]
    assert len(parts) >= 3 and c.stats["turns_cut"] >= 1 and c.stats["turns_too_long"] == 0
    assert parts[0]["part"][0] == 0 and {w["part"][1] for w in parts} == {len(parts)}
    rows = [c([w]) for w in wins]
    assert all(r["input_ids"].shape[1] <= L for r in rows)
    assert sum(int(r["response_mask"].sum()) for r in rows) == total == c.stats["assistant_tokens_trained"]
    # the parts' trained tokens, in order, are exactly the window's trained tokens: none twice, none that is not trained
    msgs = messages_from_turns(parts[0]["turns"])
    ids, trained, h = window_tokens(TOK, msgs)
    want = [t for t, x in zip(ids, trained) if x]
    got = []
    for w in parts:
        r_ids, mask = part_row(ids, trained, h, L, w["part"])
        assert r_ids[:h] == ids[:h] and len(r_ids) <= L      # every part opens with the system prompt and the task
        got += [t for t, m in zip(r_ids, mask) if m]
    assert got == want


def test_without_parts_the_long_turn_is_dropped():
    turns = big_write_trace()
    c = ComposerDataCollator(TOK, CollatorConfig(max_seq_len=256, hint_generator=dispatch, cache_size=0, cut_turns=False))
    wins = c.windows([{"turns": turns}])
    assert c.stats["turns_too_long"] >= 1 and not any("part" in w for w in wins)
    for w in wins: c([w])
    assert c.stats["assistant_tokens_trained"] < trained_total(turns)


def test_part_validated():
    c = ComposerDataCollator(TOK, CollatorConfig(max_seq_len=256))
    with pytest.raises(ValueError, match="part must be"): c([{"turns": ref_trace(), "part": (2, 2, 0)}])
