"""Teacher replay against a real loopback server: what the notebooks cannot host (concurrency, cancellation, logs, TRL).

Every test drives `replay_trace` through `composer_replication.teacher_server.TeacherServer` over real HTTP on
127.0.0.1 and counts calls *at the server*. Nothing reaches the network; no real key is used.
"""
import asyncio
import json
import logging
import os
import time

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from composer_replication.teacher_replay import (OpenAICompatibleProvider, TeacherReplayError, action_key, extract_dpo_pairs,
                                                 read_journal, replay_trace, to_preference_rows)
from composer_replication.teacher_server import Failure, ModelPolicy, TeacherServer

PLANTED = "sk-or-v1-PLANTED-7f3a9c2e1d0b4a65"
SYS = {"role": "system", "content": "You are a coding agent."}


def make_states(n, size=200, prefix="s"):
    return [{"state_id": f"{prefix}::{i:04d}",
             "messages": [SYS, {"role": "user", "content": f"task {i} " + "x" * size}],
             "student_action": '[TOOL_USE] name=Bash input={"command": "ls"}'} for i in range(n)]


def teachers(prices):
    return [{"slug": f"t/{i}", "input_per_mtok": pi, "output_per_mtok": po} for i, (pi, po) in enumerate(prices)]


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------- the key


@pytest.fixture(params=[None, "httpx"], ids=["default-client", "httpx"])
def client_kind(request):
    "Run a test over both HTTP clients: the default (aiohttp where installed) and httpx."
    if request.param is None: pytest.importorskip("aiohttp")
    return request.param


def test_planted_key_never_appears(tmp_path, caplog, capsys, monkeypatch, client_kind):
    """The key reaches the server (it demands it) but no result, journal, log line, progress bar, exception or repr."""
    caplog.set_level(logging.DEBUG)                      # httpx, httpcore, aiohttp, tenacity, ours: everything
    for name in ("httpx", "httpcore", "aiohttp", "composer_replication", "tenacity"): caplog.set_level(logging.DEBUG, logger=name)
    kw = {"transport": client_kind}
    T = teachers([(1.0, 2.0)] * 3)
    echo = Failure(400, message=f"bad request from key {PLANTED}")   # a server that echoes the key back
    pol = {"t/0": ModelPolicy(reply="fine", failures=[Failure.rate_limited(0.05), Failure.server_error(500), Failure.dropped()]),
           "t/1": ModelPolicy(reply={"tool_calls": [{"name": "Read", "arguments": {"file_path": "a.py"}}]}, failures=[Failure.error_in_200()]),
           "t/2": ModelPolicy(reply=echo)}
    j, j3 = tmp_path / "journal.jsonl", tmp_path / "journal3.jsonl"
    with TeacherServer(pol, api_key=PLANTED) as srv:
        res = run(replay_trace(make_states(4), T, api_key=PLANTED, base_url=srv.url, journal=j, backoff_s=0.01, **kw))
        # the same through the environment (OpenRouter-style base URL from OPENROUTER_BASE_URL)
        monkeypatch.setenv("OPENROUTER_API_KEY", PLANTED); monkeypatch.setenv("OPENROUTER_BASE_URL", srv.url)
        res_env = run(replay_trace(make_states(2, prefix="e"), T[:2], backoff_s=0.01, **kw))
        with pytest.raises(TeacherReplayError) as ei:        # a 401 that echoes the key
            srv.policies["t/0"] = ModelPolicy(reply=Failure(401, message=f"Invalid key {PLANTED}"))
            run(replay_trace(make_states(3, prefix="f"), T[:1], backoff_s=0.01, journal=j3, **kw))   # (j is another run's)
    assert {r["response_text"] for r in res if r["teacher_slug"] == "t/0"} == {"fine"}          # the key worked
    assert all("from key [REDACTED:openrouter_key]" in r["error"] for r in res if r["teacher_slug"] == "t/2")   # redacted, not dropped
    assert {r["error"] for r in res_env} == {None}
    out, err = capsys.readouterr()
    texts = {"results": json.dumps(res) + repr(res) + json.dumps(res_env) + repr(res_env), "journal": j.read_text() + j3.read_text(),
             "logs": caplog.text + "".join(str(r.args) for r in caplog.records), "stdout/stderr (progress bar)": out + err,
             "exception": str(ei.value) + repr(ei.value) + repr(ei.value.results) + repr(ei.value.args)}
    assert "retrying t/0" in caplog.text                                # the logs were captured at all
    if client_kind == "httpx": assert "HTTP Request" in caplog.text     # ... httpx's request log included
    for where, text in texts.items():
        assert PLANTED not in text, f"the key leaked into the {where}"
        assert PLANTED[8:20] not in text, f"part of the key leaked into the {where}"


def test_env_key_not_sent_to_an_explicit_foreign_base_url(monkeypatch):
    """OPENROUTER_API_KEY goes to OpenRouter (or OPENROUTER_BASE_URL) only: another server must get nothing."""
    monkeypatch.setenv("OPENROUTER_API_KEY", PLANTED); monkeypatch.delenv("OPENROUTER_BASE_URL", raising=False)
    with TeacherServer({"t/0": ModelPolicy()}, api_key=PLANTED) as srv:
        with pytest.raises(TeacherReplayError, match="HTTP 401"):
            run(replay_trace(make_states(1), teachers([(1, 1)]), base_url=srv.url, progress=False))
        assert srv.calls == 1


def test_openrouter_without_key_is_a_runtime_error(monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False); monkeypatch.delenv("OPENROUTER_BASE_URL", raising=False)
    with pytest.raises(RuntimeError, match="OPENROUTER_API_KEY"):
        run(replay_trace(make_states(1), progress=False))


# --------------------------------------------------------------------------- the budget


@pytest.fixture(scope="module")
def shared_server():
    with TeacherServer({}, keep_bodies=True) as srv:
        yield srv


def _exact_worst_case_prompt(body):
    "Bill the prompt exactly as the client's worst case: one token per body byte plus the 512-token preamble."
    return len(orjson.dumps(body)) + 512


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prices=st.lists(st.tuples(st.floats(0, 5), st.floats(0, 25)), min_size=1, max_size=3),
       lat=st.tuples(st.floats(0, 0.01), st.floats(0, 0.02)),
       cap=st.floats(0, 0.05), max_tokens=st.integers(1, 600), conc=st.integers(1, 24),
       n_states=st.integers(1, 10), size=st.integers(0, 2000), reply_len=st.integers(0, 4000), tight=st.booleans(),
       report_cost=st.booleans(), fail_rate=st.sampled_from([0.0, 0.2]), seed=st.integers(0, 2**16))
@example(prices=[(3.0, 15.0)] * 3, lat=(0.005, 0.01), cap=0.03, max_tokens=500, conc=8, n_states=6, size=500,
         reply_len=0, tight=True, report_cost=True, fail_rate=0.0, seed=0)
def test_cap_never_exceeded_under_concurrency(shared_server, prices, lat, cap, max_tokens, conc, n_states, size,
                                              reply_len, tight, report_cost, fail_rate, seed):
    """Random prices, latencies, sizes and caps: the server never bills more than max_total_usd in total.

    With `tight`, the server bills every call at exactly the client's reserved worst case (prompt = body bytes + 512,
    completion = max_tokens), so a client that forgot the calls in flight would overspend as soon as two overlap.
    """
    srv = shared_server
    T = teachers(prices)
    srv.policies.clear(); srv.reset()
    if tight: reply_len = 4 * max_tokens + 8
    for i, t in enumerate(T):
        srv.policies[t["slug"]] = ModelPolicy(reply="y" * reply_len, latency_s=(min(lat), max(lat)),
                                              prompt_tokens=_exact_worst_case_prompt if tight else 512,
                                              input_per_mtok=t["input_per_mtok"], output_per_mtok=t["output_per_mtok"],
                                              report_cost=report_cost, fail_rate=fail_rate, seed=seed + i,
                                              fail_with=Failure.server_error(503))
    states = make_states(n_states, size=size)
    res = run(replay_trace(states, T, max_total_usd=cap, base_url=srv.url, max_concurrency=conc, max_tokens=max_tokens,
                           backoff_s=0.001, max_retries=2, progress=False))
    billed = sum(r["cost_usd"] for r in res) if not report_cost else sum(e.get("cost") or 0.0 for e in srv.log)
    if not report_cost:   # the server did not say: recompute its bill from what it answered
        billed = sum(((_exact_worst_case_prompt(b) if tight else 512) * T[int(b["model"][2:])]["input_per_mtok"]
                      + min(max_tokens, max(1, -(-reply_len // 4))) * T[int(b["model"][2:])]["output_per_mtok"]) / 1e6
                     for b, e in zip(srv.bodies, srv.log) if e.get("status") == 200)
    assert billed <= cap * (1 + 1e-12) + 1e-15, (billed, cap)
    assert res.spent_usd <= cap * (1 + 1e-12) + 1e-15
    assert abs(sum(r["cost_usd"] for r in res) - res.spent_usd) < 1e-9           # every charge is in a result
    assert len(res) + len(res.not_attempted) == len(states) * len(T)             # nothing silently lost
    assert srv.max_in_flight <= conc
    if res.not_attempted: assert res.stopped == "budget"


# --------------------------------------------------------------------------- resumption


def test_cancelled_run_resumes_with_zero_repeated_calls(tmp_path):
    """Cancel mid-run (Ctrl-C): calls in flight are finished and journaled; the rerun sends only what is missing."""
    T = teachers([(1.0, 2.0)] * 3)
    states = make_states(30)
    j = tmp_path / "journal.jsonl"
    with TeacherServer({t["slug"]: ModelPolicy(reply="ok", latency_s=0.05) for t in T}) as srv:
        async def interrupted():
            task = asyncio.ensure_future(replay_trace(states, T, base_url=srv.url, journal=j, max_concurrency=8, progress=False))
            while srv.calls < 20: await asyncio.sleep(0.005)   # some answered, 8 more in flight
            task.cancel()
            with pytest.raises(asyncio.CancelledError): await task
        run(interrupted())
        first_calls = srv.calls
        rows, bad = read_journal(j)
        assert 20 <= len(rows) < 90 and bad == 0
        assert len(rows) == first_calls                      # every call the server answered was journaled
        res = run(replay_trace(states, T, base_url=srv.url, journal=j, max_concurrency=8, progress=False))
        assert srv.calls - first_calls == 90 - len(rows)     # the rerun sent only the missing pairs
        assert max(srv.counts.values()) == 1 and sum(srv.counts.values()) == 90
    assert len(res) == 90 and res.from_journal == len(rows) and {r["error"] for r in res} == {None}


def test_failed_pairs_are_retried_on_rerun_unless_told_not_to(tmp_path):
    T = teachers([(1.0, 1.0)])
    j = tmp_path / "j.jsonl"
    with TeacherServer({"t/0": ModelPolicy(reply="ok", failures=[Failure(400)])}) as srv:
        first = run(replay_trace(make_states(2), T, base_url=srv.url, journal=j, progress=False))
        assert [r["error"] is not None for r in first] == [True, True]
        kept = run(replay_trace(make_states(2), T, base_url=srv.url, journal=j, retry_failed=False, progress=False))
        assert srv.calls == 2 and kept.from_journal == 2
        again = run(replay_trace(make_states(2), T, base_url=srv.url, journal=j, progress=False))
        assert srv.calls == 4 and {r["response_text"] for r in again} == {"ok"}


# --------------------------------------------------------------------------- back-off and fatal answers


@pytest.mark.parametrize("failure,wait", [
    (Failure.rate_limited(0.9), 0.9),                                   # Retry-After header
    (Failure.rate_limited(0.9, in_body=True), 0.9),                     # error.metadata.headers (OpenRouter upstream)
    (Failure(429, reset_in_s=1.2, in_body=True), 1.2),                  # X-RateLimit-Reset, epoch ms, in the body
    (Failure(503, reset_in_s=1.2), 1.2),                                # X-RateLimit-Reset header on a 503
    (Failure(402, retry_after=0.6), 0.6),                               # 402 *with* Retry-After is retried
])
def test_retry_after_is_honoured(failure, wait):
    with TeacherServer({"t/0": ModelPolicy(reply="ok", failures=[failure])}) as srv:
        res = run(replay_trace(make_states(1), teachers([(1, 1)]), base_url=srv.url, backoff_s=0.001, progress=False))
        t = [e["t"] for e in srv.log]
    assert res[0]["response_text"] == "ok" and len(t) == 2
    # at least the asked wait (not the 1 ms back-off), and less than twice it: the slack is for a loaded machine's scheduling
    assert wait - 0.01 <= t[1] - t[0] <= wait * 1.3 + 0.5, t[1] - t[0]


def test_too_long_retry_after_fails_the_call_without_waiting():
    with TeacherServer({"t/0": ModelPolicy(reply="ok", failures=[Failure.rate_limited(3600)])}) as srv:
        t0 = time.perf_counter()
        res = run(replay_trace(make_states(1), teachers([(1, 1)]), base_url=srv.url, max_wait_s=5, progress=False))
        assert time.perf_counter() - t0 < 2 and srv.calls == 1
    assert res[0]["response_text"] is None and "3600 s" in res[0]["error"]


@pytest.mark.parametrize("status", [401, 403, 402])
def test_fatal_status_stops_the_run(tmp_path, status):
    """One teacher answers 401/403/402: the run stops (in-flight calls finish), raising with what completed."""
    T = teachers([(1.0, 1.0), (1.0, 1.0)])
    j = tmp_path / "j.jsonl"
    pol = {"t/0": ModelPolicy(reply="ok", latency_s=0.02),
           "t/1": ModelPolicy(reply="ok", latency_s=0.02, failures=[Failure(status)])}
    with TeacherServer(pol) as srv:
        with pytest.raises(TeacherReplayError, match=f"HTTP {status}") as ei:
            run(replay_trace(make_states(40), T, base_url=srv.url, journal=j, max_concurrency=4, progress=False))
        calls = srv.calls
    err = ei.value
    assert err.status == status and err.teacher_slug == "t/1"
    # the fatal answer is the 2nd job; with 4 workers and 20 ms per call, only calls already sent (or sent by a
    # worker before the answer was processed) may follow it, and every call the server took has a result
    assert calls == len(err.results) <= 3 * 4, (calls, len(err.results))
    assert len(err.results) + len(err.results.not_attempted) == 80 and len(err.results.not_attempted) > 60
    assert len(read_journal(j)[0]) == len(err.results)


# --------------------------------------------------------------------------- throughput and transports


class FirstWaveSlow(ModelPolicy):
    "Holds the first `shared[0]` answers (of all models together) for `slow_s` each, then answers at once."
    def __init__(self, shared, slow_s):
        super().__init__(reply="ok"); self.shared, self.slow_s = shared, slow_s
    def delay(self):
        self.shared[0] -= 1
        return self.slow_s if self.shared[0] >= 0 else 0.01


def test_concurrency_reaches_and_respects_the_limit(client_kind):
    """192 calls at max_concurrency=64: the server sees exactly 64 in flight, never more. The first 64 answers are held
    for 8 s, so the check does not depend on how fast a loaded machine starts requests (it has 8 s to start 64)."""
    T = teachers([(0, 0)] * 3)
    first = [64]
    with TeacherServer({t["slug"]: FirstWaveSlow(first, 8.0) for t in T}) as srv:
        t0 = time.perf_counter()
        res = run(replay_trace(make_states(64), T, base_url=srv.url, max_concurrency=64, transport=client_kind, progress=False))
        wall = time.perf_counter() - t0
        assert srv.max_in_flight == 64
    assert len(res) == 192 and {r["error"] for r in res} == {None}
    assert wall < 60, wall          # one after another the held answers alone would take 64 x 8 s = 512 s


def test_aiohttp_transport_end_to_end():
    pytest.importorskip("aiohttp")
    T = teachers([(1.0, 2.0)] * 2)
    pol = {t["slug"]: ModelPolicy(reply="ok", failures=[Failure.dropped(), Failure.rate_limited(0.05)]) for t in T}
    with TeacherServer(pol, api_key=PLANTED) as srv:
        res = run(replay_trace(make_states(8), T, api_key=PLANTED, base_url=srv.url, transport="aiohttp",
                               max_concurrency=8, backoff_s=0.01, progress=False))
        assert srv.calls == 8 * 2 * 3
    assert {r["response_text"] for r in res} == {"ok"}
    assert all(r["cost_usd"] > 0 for r in res)


def test_default_client_is_aiohttp_when_importable_else_httpx(monkeypatch):
    """No transport given: aiohttp when it imports, else (cleanly) httpx; transport="aiohttp" without it is an ImportError."""
    import importlib.util
    import composer_replication.teacher_replay as tr
    kinds, real = [], tr.open_http
    def peek(*a, **k):
        http = real(*a, **k); kinds.append(http.kind); return http
    monkeypatch.setattr(tr, "open_http", peek)
    T, default = teachers([(1.0, 1.0)]), "aiohttp" if importlib.util.find_spec("aiohttp") else "httpx"
    with TeacherServer({"t/0": ModelPolicy(reply="ok", failures=[Failure.dropped()])}) as srv:
        res = run(replay_trace(make_states(3), T, base_url=srv.url, backoff_s=0.01, progress=False))
        monkeypatch.setitem(__import__("sys").modules, "aiohttp", None)          # now aiohttp is not installed
        res2 = run(replay_trace(make_states(3, size=201, prefix="n"), T, base_url=srv.url, backoff_s=0.01, progress=False))
        assert srv.calls == 12                                                  # 6 states, each dropped once
        assert kinds == [default, "httpx"]
        assert {r["response_text"] for r in res + res2} == {"ok"}
        with pytest.raises(ImportError, match="pip install aiohttp"):
            run(replay_trace(make_states(1), T, base_url=srv.url, transport="aiohttp", progress=False))
        assert srv.calls == 12
    with pytest.raises(ValueError, match="transport must be"):
        run(replay_trace(make_states(1), T, base_url="http://127.0.0.1:9/v1", transport="requests", progress=False))


def test_a_proxy_in_the_environment_selects_httpx(monkeypatch):
    """httpx handles every kind of proxy: with one set for the URL, the default client is httpx; NO_PROXY is honoured."""
    pytest.importorskip("aiohttp")
    import composer_replication.teacher_replay as tr
    async def kind(url):
        http = tr.open_http(url, {}, None, None, 4, 5.0)
        await http.aclose()
        return http.kind
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(k, raising=False)
    assert run(kind("http://10.1.2.3:8000/v1/chat/completions")) == "aiohttp"
    monkeypatch.setenv("HTTP_PROXY", "socks5://user:pw@127.0.0.1:9")
    assert run(kind("http://10.1.2.3:8000/v1/chat/completions")) == "httpx"
    assert run(kind("https://10.1.2.3/v1/chat/completions")) == "aiohttp"      # no proxy for https
    with pytest.raises(ValueError, match="socks5 one") as ei:
        run(tr.open_http("http://10.1.2.3:8000/v1/chat/completions", {}, "aiohttp", None, 4, 5.0).aclose())
    assert "pw" not in str(ei.value)
    monkeypatch.setenv("NO_PROXY", "10.1.2.3")
    assert run(kind("http://10.1.2.3:8000/v1/chat/completions")) == "aiohttp"


def test_both_clients_classify_failures_alike(client_kind):
    """Refused connection: retried, charged nothing. Dropped after sending: retried, charged the worst case."""
    T = teachers([(1.0, 1.0)])
    res = run(replay_trace(make_states(1), T, base_url="http://127.0.0.1:9/v1", transport=client_kind, max_retries=1,
                           backoff_s=0.001, progress=False))
    assert "connection failed" in res[0]["error"] and "after 2 attempt(s)" in res[0]["error"] and res[0]["cost_usd"] == 0
    with TeacherServer({"t/0": ModelPolicy(reply="ok", fail_rate=1.0, fail_with=Failure.dropped())}) as srv:
        res = run(replay_trace(make_states(1), T, base_url=srv.url, transport=client_kind, max_retries=1, backoff_s=0.001,
                               progress=False))
        assert srv.calls == 2
    assert "charged at worst case" in res[0]["error"] and res[0]["cost_usd"] > 0 and res.spent_usd == res[0]["cost_usd"]


# --------------------------------------------------------------------------- pairs


json_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=4), max_leaves=8)


@settings(max_examples=60, deadline=None)
@given(inp=st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=6), data=st.data())
def test_action_key_ignores_json_key_order_and_formatting(inp, data):
    perm = data.draw(st.permutations(list(inp.items())))
    a = '[TOOL_USE] name=Edit input=' + json.dumps(inp, ensure_ascii=False, sort_keys=True)
    b = 'Doing it.\n\n[TOOL_USE] name=Edit input=' + json.dumps(dict(perm), ensure_ascii=True, indent=None)
    assert action_key(a) == action_key(b)
    assert action_key(a) != action_key('[TOOL_USE] name=Write input=' + json.dumps(inp, sort_keys=True))


def test_preference_rows_feed_trl_dpo_trainer(tmp_path):
    """The rows load with datasets and TRL's DPOTrainer tokenizes and trains on them (tiny model, one step)."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer
    from composer_replication.tiny import tiny_causal_lm, tiny_tokenizer
    U = {"role": "user", "content": "Fix utils.py"}
    A1 = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
          "function": {"name": "Read", "arguments": '{"file_path": "utils.py"}'}}]}
    T1 = {"role": "tool", "tool_call_id": "c1", "content": "No such file", "is_error": True}
    states = [{"state_id": "a", "messages": [SYS, U, A1, T1], "student_action": "I give up."},
              {"state_id": "b", "messages": [SYS, U], "student_action": '[TOOL_USE] name=Read input={"file_path": "x"}'}]
    acts = [{"state_id": s, "teacher_slug": t, "response_text": txt, "latency_s": 0.1, "prompt_tokens": 1,
             "completion_tokens": 1, "cost_usd": 0.0, "error": None}
            for s, t, txt in [("a", "t/0", '[TOOL_USE] name=Bash input={"command": "ls", "all": true}'),
                              ("a", "t/1", '[TOOL_USE] name=Bash input={"all": true, "command": "ls"}'),
                              ("b", "t/0", "Sure, done."), ("b", "t/1", "Sure,   done.")]]
    pairs = extract_dpo_pairs(states, acts)
    assert [p["state_id"] for p in pairs] == ["a", "b"]
    ds = Dataset.from_list(to_preference_rows(pairs))
    tok = tiny_tokenizer()
    args = DPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, report_to=[], save_strategy="no",
                     use_cpu=True, logging_steps=1)
    trainer = DPOTrainer(model=tiny_causal_lm(seed=0), ref_model=tiny_causal_lm(seed=0), args=args, train_dataset=ds,
                         processing_class=tok)
    ex = trainer.train_dataset[0]
    chosen = tok.decode(ex["chosen_ids"])                                      # the tool call as the template renders it
    assert chosen.startswith('<tool_call>\n{"name": "Bash", "arguments": {"'), chosen
    assert '"command": "ls"' in chosen and "[TOOL_USE]" not in chosen
    assert tok.decode(ex["rejected_ids"]).startswith("I give up.")
    assert "<tool_response>\nNo such file" in tok.decode(ex["prompt_ids"])      # the tool result reached the prompt
    out = trainer.train()
    assert abs(out.training_loss - 0.6931471805599453) < 1e-4                 # policy == reference: loss = ln 2


def test_a_broken_transport_fails_calls_not_the_run():
    """An unexpected exception in the transport fails those calls (redacted, charged at worst case) without a crash."""
    import httpx

    class Boom(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request):
            raise ValueError(f"boom with {request.headers['authorization']}")
    res = run(replay_trace(make_states(2), teachers([(1.0, 1.0)]), api_key=PLANTED, base_url="http://127.0.0.1:9/v1",
                           transport=Boom(), progress=False))
    assert [r["response_text"] for r in res] == [None, None]
    assert all("ValueError: boom with Bearer [REDACTED:openrouter_key]" in r["error"] and r["cost_usd"] > 0 for r in res)
    assert PLANTED not in repr(res)


def test_a_second_provider_is_one_class():
    """A provider with its own header and its own cost field: one subclass, passed as `endpoint`; nothing else changes."""
    import httpx
    seen = []

    class Acme(OpenAICompatibleProvider):
        "A made-up provider: an `X-Acme-Key` header instead of a Bearer token, the cost in `usage.billed_usd`."
        name = "acme"
        def headers(self): return {"Content-Type": "application/json", "X-Acme-Key": self.api_key}
        def request_body(self, messages, teacher, **kw): return {**super().request_body(messages, teacher, **kw), "acme": {"tier": 1}}
        def reported_cost(self, usage): return usage.get("billed_usd")

    def acme(request):
        seen.append((dict(request.headers), json.loads(request.content)))
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": "ok"}}],
                                         "usage": {"prompt_tokens": 10, "completion_tokens": 1, "cost": 9.0, "billed_usd": 2e-6}})
    T = teachers([(1.0, 1.0)])
    res = run(replay_trace(make_states(2), T, endpoint=Acme("https://api.acme.test/v1", api_key=PLANTED),
                           transport=httpx.MockTransport(acme), progress=False))
    assert [r["response_text"] for r in res] == ["ok", "ok"] and [r["cost_usd"] for r in res] == [2e-6, 2e-6]
    assert all(h["x-acme-key"] == PLANTED and "authorization" not in h and b["acme"] == {"tier": 1} and "provider" not in b
               for h, b in seen)
    assert PLANTED not in repr(Acme("https://api.acme.test/v1", api_key=PLANTED))


def test_normalized_pairs_feed_the_collator():
    """replaysim's normalized pairs, converted with `to_collator_pairs`, are DPO pairs the collator tokenizes like the originals."""
    pytest.importorskip("transformers")
    from composer_replication.replaysim import DJNormalizer, to_collator_pairs
    from composer_replication.tiny import tiny_tokenizer
    from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator
    U = {"role": "user", "content": "Fix utils.py"}
    states = [{"state_id": "a", "messages": [SYS, U], "student_action": "I give up."},
              {"state_id": "b", "messages": [SYS, U], "student_action": '[TOOL_USE] name=Read input={"file_path": "x"}'}]
    from composer_replication.ingestion.core import render_action
    ls = lambda *keys: [{"type": "tool_use", "name": "Bash", "input": {k: {"command": "ls", "all": True}[k] for k in keys}}]
    acts = [{"state_id": s, "teacher_slug": t, "response_text": render_action(a), "action": a, "latency_s": 0.1,   # as replay_trace makes them
             "prompt_tokens": 1, "completion_tokens": 1, "cost_usd": 0.0, "error": None}
            for s, t, a in [("a", "t/0", ls("command", "all")), ("a", "t/1", ls("all", "command")),
                            ("b", "t/0", [{"type": "text", "text": "Sure, done."}]), ("b", "t/1", [{"type": "text", "text": "Sure,   done."}])]]
    pairs = extract_dpo_pairs(states, acts)
    converted = to_collator_pairs(DJNormalizer(skip_dj=True).normalize(pairs))
    assert [set(p) >= {"state_id", "state_messages", "chosen", "rejected", "n_teachers_agreeing"} for p in converted] == [True, True]
    tok = tiny_tokenizer()
    ex = {"trace_id": "t", "turns": [SYS, U, {"role": "assistant", "content": "Looking."}]}
    batch = lambda ps: ComposerDataCollator(tok, CollatorConfig(pad_token_id=tok.pad_token_id))([{**ex, "dpo_pairs": ps}])
    a, b = batch(pairs), batch(converted)
    for k in ("dpo_chosen_input_ids", "dpo_rejected_input_ids", "dpo_chosen_response_mask", "dpo_rejected_response_mask"):
        assert a[k].tolist() == b[k].tolist(), k
    assert a["dpo_chosen_input_ids"].shape[0] == 2 and '<tool_call>' in tok.decode(b["dpo_chosen_input_ids"][0])
    assert [(p["chosen"], p["chosen_action"], p["rejected"]) for p in converted] == [(p["chosen"], p["chosen_action"], p["rejected"]) for p in pairs]
