"""`replay` and `pairs` from the command line against hostile servers, signals, a full disk and careless arguments.

A loopback `TeacherServer` (in this process, in a thread) counts every request it receives; the commands run either
in-process (`main`) or, where a signal or a second process is the point, as fresh `composer-replication` processes.
Nothing reaches the network; no real key is used.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from composer_replication.cli import main
from composer_replication.teacher_server import ModelPolicy, TeacherServer

EXE = shutil.which("composer-replication") or str(Path(sys.executable).parent/"composer-replication")
SYS = {"role": "system", "content": "You are a coding agent."}
KEY = "lo-k3y-" + "9f2c4e6a8b0d1f3e5a7c6b"      # a key no redaction pattern knows: only the key scrubber can catch it


def write_states(path, n, prefix="s", secret=""):
    states = [{"state_id": f"{prefix}::{i:04d}", "messages": [SYS, {"role": "user", "content": f"task {i} {secret}"}],
               "student_action": '[TOOL_USE] name=Bash input={"command": "ls"}'} for i in range(n)]
    Path(path).write_text("".join(json.dumps(s) + "\n" for s in states))
    return states


def run_cli(*argv, env=None):
    "main() in-process: (exit status, stdout, stderr)."
    with contextlib.ExitStack() as st:
        if env is not None:
            from unittest import mock
            st.enter_context(mock.patch.dict(os.environ, env))
        o, e = st.enter_context(contextlib.redirect_stdout(io.StringIO())), st.enter_context(contextlib.redirect_stderr(io.StringIO()))
        rc = main([str(a) for a in argv])
    return rc, o.getvalue(), e.getvalue()


def spawn(*argv, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("OPENROUTER_")}
    e.update(env or {})
    return subprocess.Popen([EXE, *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)


def journal_rows(path):
    if not Path(path).exists(): return []
    return [r for r in map(json.loads, Path(path).read_text().splitlines()) if "teacher_slug" in r]


def wait_for_rows(path, n, timeout=60):
    t = time.monotonic()
    while len(journal_rows(path)) < n:
        assert time.monotonic() - t < timeout, f"the journal never reached {n} rows"
        time.sleep(0.05)


def snapshot(folder):
    "Every file under `folder`: (bytes, mtime_ns)."
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def one_line(err, *needles):
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles: assert n in err, (n, err)


# --------------------------------------------------------------------------- 1. secrets


def test_an_echoed_key_is_written_nowhere(tmp_path, caplog):
    """Teachers that echo the key (header, bare, in a tool call, cut short) leave no trace of it in any file or output."""
    def echo(body):
        return {"content": f"Authorization: Bearer {KEY}\nmy key is {KEY}, or {KEY[:14]}",
                "tool_calls": [{"name": "Bash", "arguments": {"command": f"curl -H 'X-Key: {KEY}' -u me:{KEY} http://x"}}]}
    write_states(tmp_path/"states.jsonl", 3, secret="and GITHUB_TOKEN=ghp_" + "Q7" * 18)
    with TeacherServer({"a": ModelPolicy(reply=echo), "b": ModelPolicy(reply=echo)}, api_key=KEY, keep_bodies=True) as srv:
        env = {"OPENROUTER_API_KEY": KEY, "OPENROUTER_BASE_URL": srv.url}
        rc, out, err = run_cli("replay", tmp_path/"states.jsonl", "--teachers", "a@1/2,b@1/2", "--max-usd", "1",
                               "--out", tmp_path/"rep", "--quiet", env=env)
        assert rc == 0, err
        assert srv.calls == 6 and all(e["status"] == 200 for e in srv.log)      # the key was sent, and it worked
        sent = json.dumps(srv.bodies)
        rc2, out2, err2 = run_cli("pairs", tmp_path/"rep", "--out", tmp_path/"pairs.jsonl", "--trl", tmp_path/"trl", env=env)
    assert rc2 == 0 and "3 DPO pairs" in out2, (out2, err2)
    assert "ghp_Q7Q7" not in sent and "[REDACTED:github_token]" in sent       # the state's token was redacted again before sending
    files = {p.name: p.read_text() for p in [*tmp_path.rglob("*.jsonl"), *tmp_path.rglob("*.json")]}
    assert {"teacher_calls.jsonl", "states.jsonl", "replay_summary.json", "pairs.jsonl", "train.jsonl"} <= set(files)
    texts = {**files, "output": out + err + out2 + err2, "logs": caplog.text}
    assert "***" in files["teacher_calls.jsonl"] and "***" in files["pairs.jsonl"] and "***" in files["train.jsonl"]
    for where, text in texts.items():
        for part in (KEY, KEY[:12], KEY[-12:], KEY.encode().hex()[:24]):
            assert part not in text, f"{part!r} of the key leaked into {where}"


# --------------------------------------------------------------------------- 2. paid calls


def slow_server(latency=0.3):
    return TeacherServer({"a": ModelPolicy(reply="done", latency_s=latency), "b": ModelPolicy(reply="done", latency_s=latency)})


def test_a_second_replay_on_the_same_out_is_refused(tmp_path):
    write_states(tmp_path/"states.jsonl", 12)
    with slow_server() as srv:
        args = ("replay", tmp_path/"states.jsonl", "--teachers", f"{srv.url},a,b", "--max-usd", "1", "--out", tmp_path/"rep",
                "--quiet", "--concurrency", "2")
        first = spawn(*args)
        wait_for_rows(tmp_path/"rep"/"teacher_calls.jsonl", 1)
        second = spawn(*args)
        _, err2 = second.communicate(timeout=120)
        out1, err1 = first.communicate(timeout=120)
        calls = srv.calls
    assert second.returncode == 2, err2
    one_line(err2, "error: --out", "in use by another replay", f"(process {first.pid})")
    assert first.returncode == 0, err1
    assert calls == 24 and len(journal_rows(tmp_path/"rep"/"teacher_calls.jsonl")) == 24   # nothing paid twice


@pytest.mark.parametrize("sig, code, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")])
def test_a_signal_mid_run_records_the_calls_in_flight_and_the_resume_pays_nothing_twice(tmp_path, sig, code, name):
    write_states(tmp_path/"states.jsonl", 20)
    j = tmp_path/"rep"/"teacher_calls.jsonl"
    with slow_server(0.4) as srv:
        args = ("replay", tmp_path/"states.jsonl", "--teachers", f"{srv.url},a,b", "--max-usd", "1", "--out", tmp_path/"rep",
                "--quiet", "--concurrency", "4")
        p = spawn(*args)
        wait_for_rows(j, 4)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
        sent_before, recorded = srv.calls, len(journal_rows(j))
        stopped = json.loads((tmp_path/"rep"/"replay_summary.json").read_text())["stopped"]
        r = spawn(*args); out2, err2 = r.communicate(timeout=120)
        total, worst = srv.calls, max(srv.counts.values())
    assert p.returncode == code, (p.returncode, err)
    one_line(err, f"composer-replication replay: interrupted ({name})", "rerun the same command to resume")
    assert recorded == sent_before < 40, (recorded, sent_before)        # every call the server received is in the journal
    assert all(r["error"] is None for r in journal_rows(j)), "the calls in flight were awaited, not abandoned"
    assert stopped == "interrupted"
    assert r.returncode == 0, err2
    assert (total, worst) == (40, 1), (total, worst)                    # the resume paid for nothing twice
    print(f"{name}: {sent_before} calls sent and recorded before the signal; {total - sent_before} on resume; total {total} == 40")


@pytest.mark.parametrize("first, second", [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGINT), (signal.SIGINT, signal.SIGTERM)])
def test_a_second_signal_loses_no_paid_answer(tmp_path, first, second):
    "A second signal 0.7 s after the first, while calls are in flight: every answer the server sent is in the journal, none paid twice."
    write_states(tmp_path/"states.jsonl", 20)
    j = tmp_path/"rep"/"teacher_calls.jsonl"
    with slow_server(1.5) as srv:
        args = ("replay", tmp_path/"states.jsonl", "--teachers", f"{srv.url},a,b", "--max-usd", "1", "--out", tmp_path/"rep",
                "--quiet", "--concurrency", "4")
        p = spawn(*args)
        wait_for_rows(j, 4)
        time.sleep(0.3)                          # the next 4 calls are on their way
        p.send_signal(first); time.sleep(0.7); p.send_signal(second)
        out, err = p.communicate(timeout=60)
        sent_before, rows = srv.calls, journal_rows(j)
        r = spawn(*args); out2, err2 = r.communicate(timeout=120)
        total, worst = srv.calls, max(srv.counts.values())
    assert p.returncode in (130, 143), (p.returncode, err)
    assert "Traceback" not in err, err
    assert len(rows) == sent_before and all(r["error"] is None for r in rows), (sent_before, [r["error"] for r in rows])
    assert r.returncode == 0, err2
    assert (total, worst) == (40, 1), (total, worst)                    # the resume paid for nothing twice


def test_a_failed_journal_write_stops_the_run_before_the_next_call(tmp_path, monkeypatch):
    from composer_replication.jsonl import JsonlAppender
    real, n = JsonlAppender.write, []
    def full_disk(self, rec):
        if len(n) >= 3: raise OSError(28, "No space left on device")
        n.append(rec); return real(self, rec)
    monkeypatch.setattr(JsonlAppender, "write", full_disk)
    write_states(tmp_path/"states.jsonl", 10)
    with TeacherServer({"a": ModelPolicy(reply="done"), "b": ModelPolicy(reply="done")}) as srv:
        rc, out, err = run_cli("replay", tmp_path/"states.jsonl", "--teachers", f"{srv.url},a,b", "--max-usd", "1",
                               "--out", tmp_path/"rep", "--quiet", "--concurrency", "1")
        calls = srv.calls
    assert rc == 1, (rc, err)
    one_line(err, "composer-replication replay: could not write the replay journal", "No space left on device",
             "the run stopped before sending another call")
    assert calls == 3                   # the stamp and 2 results written; the 3rd answer could not be: nothing sent after it
    assert len(journal_rows(tmp_path/"rep"/"teacher_calls.jsonl")) == 2


def test_prices_given_win_over_a_reported_cost_of_zero(tmp_path):
    write_states(tmp_path/"states.jsonl", 4)
    with TeacherServer({"a": ModelPolicy(reply="done"), "b": ModelPolicy(reply="done")}) as srv:     # reports usage.cost = 0
        rc, out, err = run_cli("replay", tmp_path/"states.jsonl", "--teachers", f"{srv.url},a@2/8,b", "--max-usd", "1",
                               "--out", tmp_path/"rep", "--quiet")
        assert {e["cost"] for e in srv.log} == {0.0}
    assert rc == 0, err
    rows = journal_rows(tmp_path/"rep"/"teacher_calls.jsonl")
    a = [r for r in rows if r["teacher_slug"] == "a"]
    assert all(r["cost_usd"] == pytest.approx((r["prompt_tokens"]*2 + r["completion_tokens"]*8)/1e6) and r["cost_usd"] > 0 for r in a)
    assert {r["cost_usd"] for r in rows if r["teacher_slug"] == "b"} == {0.0}       # no price given: the server's cost
    s = json.loads((tmp_path/"rep"/"replay_summary.json").read_text())
    assert s["spent_usd"] == pytest.approx(sum(r["cost_usd"] for r in a))


# --------------------------------------------------------------------------- 3. inputs


@pytest.fixture
def replayed(tmp_path):
    "A replay folder of 3 states where both teachers agree against the student."
    write_states(tmp_path/"states.jsonl", 3)
    with TeacherServer({"a": ModelPolicy(reply="done"), "b": ModelPolicy(reply="done")}) as srv:
        rc, out, err = run_cli("replay", tmp_path/"states.jsonl", "--teachers", f"{srv.url},a,b", "--max-usd", "1",
                               "--out", tmp_path/"rep", "--quiet")
    assert rc == 0, err
    return tmp_path


@pytest.mark.parametrize("argv, needle", [
    (["pairs", "{d}/rep", "--out", "{d}/rep/teacher_calls.jsonl"], "is the replay's journal, an input"),
    (["pairs", "{d}/rep", "--out", "{d}/rep/states.jsonl"], "is the replay's states, an input"),
    (["pairs", "{d}/rep", "--out", "{d}/rep/./replay_summary.json"], "is the replay's summary, an input"),
    (["pairs", "{d}/rep", "--out", "{d}/copy.jsonl"], "is a replay journal (paid teacher calls)"),
    (["pairs", "{d}/rep", "--out", "{d}/p.jsonl", "--trl", "{d}/rep/teacher_calls.jsonl"], "--trl"),
    (["pairs", "{d}/rep", "--out", "{d}/trl/train.jsonl", "--trl", "{d}/trl"], "is the pairs file (--out)"),
    (["replay", "{d}/rep/teacher_calls.jsonl", "--teachers", "http://127.0.0.1:9/v1,a,b", "--max-usd", "1", "--out", "{d}/rep"], "STATES"),
    (["replay", "{d}/rep/replay_summary.json", "--teachers", "http://127.0.0.1:9/v1,a,b", "--max-usd", "1", "--out", "{d}/rep"], "STATES"),
    (["replay", "{d}/other.jsonl", "--teachers", "http://127.0.0.1:9/v1,a,b", "--max-usd", "1", "--out", "{d}/rep"], "belongs to another run"),
    (["replay", "{d}/states.jsonl", "--teachers", "http://127.0.0.1:9/v1,a,c", "--max-usd", "1", "--out", "{d}/rep"], "its teachers are"),
])
def test_no_command_writes_over_its_inputs_or_a_journal(replayed, argv, needle):
    d = replayed
    shutil.copy(d/"rep"/"teacher_calls.jsonl", d/"copy.jsonl")
    write_states(d/"other.jsonl", 2, prefix="o")
    (d/"trl").mkdir()
    before = snapshot(d)
    rc, out, err = run_cli(*[a.format(d=d) for a in argv])
    assert rc == 2, (rc, err)
    one_line(err, "error: ", needle)
    assert snapshot(d) == before            # refused before anything was written (no lock file, no states.jsonl rewritten)


def test_replay_resumes_from_its_own_states_file_but_never_rewrites_it(tmp_path):
    "A trace with a secret: `--out DIR` keeps it redacted, and resuming from DIR/states.jsonl is the same run, rewriting nothing."
    write_states(tmp_path/"states.jsonl", 3, secret="AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    with TeacherServer({"a": ModelPolicy(reply="done"), "b": ModelPolicy(reply="done")}) as srv:
        rc, out, err = run_cli("replay", tmp_path/"states.jsonl", "--teachers", f"{srv.url},a,b", "--max-usd", "1",
                               "--out", tmp_path/"rep", "--quiet")
    assert rc == 0, err
    kept = (tmp_path/"rep"/"states.jsonl").read_text()
    assert "wJalrXUtnFEMI" not in kept and "[REDACTED:aws_secret_key]" in kept
    before = snapshot(tmp_path/"rep")
    rc, out, err = run_cli("replay", tmp_path/"rep"/"states.jsonl", "--teachers", "http://127.0.0.1:9/v1,a,b", "--max-usd", "1",
                           "--out", tmp_path/"rep", "--quiet")
    assert rc == 0 and "6 from the journal" in out, (out, err)          # the same run: nothing sent (port 9 is closed)
    after = snapshot(tmp_path/"rep")
    assert after["states.jsonl"] == before["states.jsonl"] and after["teacher_calls.jsonl"][0] == before["teacher_calls.jsonl"][0]
    # a hand-edited states.jsonl inside --out is another trace: refused, nothing changed
    (tmp_path/"rep"/"states.jsonl").write_text(kept.replace("task 0", "task zero"))
    before = snapshot(tmp_path)
    rc, out, err = run_cli("replay", tmp_path/"rep"/"states.jsonl", "--teachers", "http://127.0.0.1:9/v1,a,b", "--max-usd", "1",
                           "--out", tmp_path/"rep")
    assert rc == 2; one_line(err, "belongs to another run")
    assert snapshot(tmp_path) == before


# --------------------------------------------------------------------------- 4. answers that are no actions


def test_invalid_answers_are_error_rows_counted_and_never_pairs(tmp_path):
    write_states(tmp_path/"states.jsonl", 3)
    pol = {"a": ModelPolicy(reply={"tool_calls": [{"name": "Bash", "arguments": '{"command": "rm'}]}),
           "b": ModelPolicy(reply={"tool_calls": [{"name": "Read", "arguments": "{}"}] * 17}),
           "c": ModelPolicy(reply={"tool_calls": [{"name": "Bash\r\nX-Injected: 1", "arguments": "{}"}]})}
    with TeacherServer(pol) as srv:
        rc, out, err = run_cli("replay", tmp_path/"states.jsonl", "--teachers", f"{srv.url},a,b,c", "--max-usd", "1",
                               "--out", tmp_path/"rep", "--quiet")
        rc_again, _, _ = run_cli("replay", tmp_path/"states.jsonl", "--teachers", f"{srv.url},a,b,c", "--max-usd", "1",
                                 "--out", tmp_path/"rep", "--quiet")
        calls = srv.calls
    assert (rc, rc_again, calls) == (0, 0, 9)          # paid answers: the resume does not ask again
    s = json.loads((tmp_path/"rep"/"replay_summary.json").read_text())
    assert (s["invalid_actions"], s["failed"]) == (9, 9)
    errors = {r["teacher_slug"]: r["error"] for r in journal_rows(tmp_path/"rep"/"teacher_calls.jsonl")}
    assert errors["a"].startswith("invalid action: tool call 0 (Bash): the arguments are not a JSON object")
    assert errors["b"].startswith("invalid action: 17 tool calls, more than max_tool_calls=16")
    assert "is not a tool identifier" in errors["c"]
    rc, out, err = run_cli("pairs", tmp_path/"rep", "--out", tmp_path/"pairs.jsonl", "--threshold", "1")
    assert rc == 0 and "0 DPO pairs" in out and "9 invalid actions left out" in out, out
    assert (tmp_path/"pairs.jsonl").read_text() == ""
    rc, out, err = run_cli("pairs", tmp_path/"rep", "--out", tmp_path/"pairs2.jsonl", "--threshold", "1", "--trl", tmp_path/"trl")
    assert rc == 0 and "TRL" not in out, out            # 0 pairs: no dataset `datasets.load_dataset` would die on
    one_line(err, "0 pairs", "no TRL dataset written (0 rows)")
    assert not (tmp_path/"trl"/"train.jsonl").exists()


def test_max_tool_calls_is_an_option(tmp_path):
    write_states(tmp_path/"states.jsonl", 2)
    with TeacherServer({"a": ModelPolicy(reply={"tool_calls": [{"name": "Read", "arguments": "{}"}] * 3})}) as srv:
        rc, out, err = run_cli("replay", tmp_path/"states.jsonl", "--teachers", f"{srv.url},a", "--max-usd", "1",
                               "--out", tmp_path/"rep", "--quiet", "--max-tool-calls", "2")
    assert rc == 0 and json.loads((tmp_path/"rep"/"replay_summary.json").read_text())["invalid_actions"] == 2
    rc, out, err = run_cli("replay", tmp_path/"states.jsonl", "--teachers", "http://127.0.0.1:9/v1,a", "--max-usd", "1",
                           "--out", tmp_path/"x", "--max-tool-calls", "0")
    assert rc == 2; one_line(err, "--max-tool-calls must be >= 1")


# --------------------------------------------------------------------------- 5. unexpected errors


def test_an_unexpected_error_is_one_line_naming_the_stage(tmp_path, monkeypatch):
    import composer_replication.recipe_build as recipe_mod
    write_states(tmp_path/"states.jsonl", 2)
    (tmp_path/"r.yaml").write_text(f"model: tiny\noutput_dir: {tmp_path/'run'}\ndata:\n  states: {tmp_path/'states.jsonl'}\n")
    def boom(r, progress=True): raise RuntimeError("size mismatch for lm_head.weight: " + "x" * 2000)
    monkeypatch.setattr(recipe_mod, "train_recipe", boom)
    rc, out, err = run_cli("train", "--config", tmp_path/"r.yaml")
    assert rc == 1
    one_line(err, "composer-replication train: failed while training (loading the model tiny", "RuntimeError: size mismatch", "--debug")
    assert len(err) < 500
    with pytest.raises(RuntimeError, match="size mismatch"): main(["--debug", "train", "--config", str(tmp_path/"r.yaml")])


def test_eval_on_a_device_this_build_lacks_is_one_line(tmp_path):
    import torch
    if torch.cuda.is_available(): pytest.skip("this build has CUDA")
    r = subprocess.run([EXE, "eval", tmp_path, tmp_path/"e.jsonl", "--model", "tiny", "--out", tmp_path/"o", "--device", "cuda"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    one_line(r.stderr, "error: --device cuda: this torch build has no usable CUDA", "use --device cpu")


def test_a_really_full_disk_stops_the_run(tmp_path):
    "The same on a real full filesystem: a 48 KiB tmpfs (needs the right to mount one; skipped without it)."
    disk = tmp_path/"disk"; disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(disk)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        write_states(tmp_path/"states.jsonl", 80)
        with TeacherServer({"a": ModelPolicy(reply="done"), "b": ModelPolicy(reply="done")}) as srv:
            p = spawn("replay", tmp_path/"states.jsonl", "--teachers", f"{srv.url},a,b", "--max-usd", "1", "--out", disk/"rep",
                      "--quiet", "--concurrency", "1")
            out, err = p.communicate(timeout=120)
            calls = srv.calls
        rows = journal_rows_tolerant(disk/"rep"/"teacher_calls.jsonl")
    finally: subprocess.run(["umount", str(disk)])
    assert p.returncode == 1, (p.returncode, err)
    one_line(err, "composer-replication replay: could not write the replay journal", "No space left on device")
    assert 0 < len(rows) < 160 and calls == len(rows) + 1, (calls, len(rows))   # the answer that could not be written is the last paid
    print(f"full tmpfs: {len(rows)} rows written, {calls} calls sent")


def journal_rows_tolerant(path):
    "Journal rows, skipping a torn last line."
    out = []
    for line in Path(path).read_text(errors="replace").splitlines():
        try: r = json.loads(line)
        except ValueError: continue
        if "teacher_slug" in r: out.append(r)
    return out
