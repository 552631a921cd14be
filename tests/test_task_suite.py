"""The task suite beyond the notebook's lessons: every task x scenario pair, many seeds, determinism across processes.

Each session is ingested with the real `ClaudeCodeIngester`. The checks are the invariants that evaluation relies on:
the file is clean and has one state per expected row, `recorded_ok` agrees with `action_matches`, every error the agent
sees has the `classify_error` kind its row names, a distractor is never the right action, and the scripted teachers
produce a DPO pair exactly where the recorded action was wrong.
"""
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from composer_replication.ingestion.claude_code import ClaudeCodeIngester
from composer_replication.task_suite import (CLAUDE_CODE_TOOLS, SCENARIOS, SPLITS, TASKS, _COMPAT, action_matches,
                                             error_sites, load_expected, make_session, make_task_suite, suite_names)
from composer_replication.task_suite_teachers import SUITE_TEACHERS, suite_policies
from composer_replication.teacher_replay import extract_dpo_pairs, replay_trace
from composer_replication.teacher_server import TeacherServer

COMBOS = [(t, s) for s in SCENARIOS for t in _COMPAT[s]]


def check_session(sess, folder):
    "Ingest one generated session and check every invariant; returns the ingested states."
    path = Path(folder)/f"{sess.session_id}.jsonl"
    path.write_text(sess.jsonl)
    ing = ClaudeCodeIngester()
    states = list(ing.ingest(path))
    st_ = ing.last_stats
    assert (st_.n_bad_json_lines, st_.skipped_truncated_lines, st_.n_orphan_tool_results, st_.n_missing_tool_results) == (0, 0, 0, 0)
    assert st_.version_warnings == []
    assert [s["state_id"] for s in states] == [r["state_id"] for r in sess.expected]
    assert len(states) == sess.meta["n_states"]
    rows = {r["state_id"]: r for r in sess.expected}
    for s in states:
        r = rows[s["state_id"]]
        assert action_matches(s["student_action"], r) == r["recorded_ok"], s["state_id"]
        assert action_matches(r["action"], r)
        assert not action_matches(r["distractor"], r)
    sites = error_sites(states, CLAUDE_CODE_TOOLS)
    assert sites, "every session meets an error"
    for e in sites:
        assert rows[e["state_id"]]["error_recovery"] and e["kind"] == rows[e["state_id"]]["error_kind"], e
    assert {rows[e["state_id"]]["scenario"] for e in sites} >= {sess.scenario}
    path.unlink()
    return states


@pytest.mark.parametrize("task,scenario", COMBOS)
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_every_task_and_scenario(tmp_path, task, scenario, split, rate):
    sess = make_session(split, 3, task=task, scenario=scenario, recovery_rate=rate)
    check_session(sess, tmp_path)
    firsts = [r for r in sess.expected if r["attempt"] == 0]
    assert firsts and all(r["recorded_ok"] == bool(rate) for r in firsts)
    if rate == 1.0:  # a perfect agent: the only wrong recorded action is the planted mistake itself
        assert sum(not r["recorded_ok"] for r in sess.expected) == (0 if scenario == "failing_test" else 1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), split=st.sampled_from(SPLITS), rate=st.sampled_from([0.0, 0.5, 1.0]))
def test_any_seed(tmp_path, seed, split, rate):
    check_session(make_session(split, seed, recovery_rate=rate), tmp_path)


def test_same_bytes_under_any_hash_seed(tmp_path):
    "No set or dict order leaks into the files: two processes with different PYTHONHASHSEED write the same bytes."
    code = "import sys; from composer_replication.task_suite import make_task_suite; make_task_suite(sys.argv[1], 12, 5, seed=4)"
    for h in ("0", "12345"):
        subprocess.run([sys.executable, "-c", code, str(tmp_path/h)], check=True, env={**os.environ, "PYTHONHASHSEED": h})
    tree = lambda d: {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}
    a, b = tree(tmp_path/"0"), tree(tmp_path/"12345")
    assert len(a) == 12 + 5 + 6 and a == b   # sessions, and expected.jsonl, tools.json, manifest.json per split


@pytest.mark.parametrize("seed", [1, 2])
def test_pairs_exactly_where_recorded_action_is_wrong(tmp_path, seed):
    make_task_suite(tmp_path, 10, 4, seed=seed)
    for split in SPLITS:
        states = list(ClaudeCodeIngester().ingest(tmp_path/split/"sessions"))
        rows = {r["state_id"]: r for r in load_expected(tmp_path/split)}
        with TeacherServer(suite_policies(states, list(rows.values()))) as srv:
            res = asyncio.run(replay_trace(states, SUITE_TEACHERS, max_total_usd=1.0, base_url=srv.url, progress=False))
            assert srv.calls == 3*len(states)
        assert all(r["error"] is None for r in res)
        pairs = extract_dpo_pairs(states, res, agreement_threshold=2)
        assert {p["state_id"] for p in pairs} == {sid for sid, r in rows.items() if not r["recorded_ok"]}
        assert all(action_matches(p["chosen"], rows[p["state_id"]]) for p in pairs)
        assert not any(action_matches(p["rejected"], rows[p["state_id"]]) for p in pairs)
    tr, ho = suite_names(tmp_path/"train"), suite_names(tmp_path/"heldout")
    assert all(not (tr[k] & ho[k]) for k in tr)
