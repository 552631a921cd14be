"""`RepoEnv` run for real: the task suite's recorded solutions, replayed through the tools in a real sandbox, score 1.0
and the untouched repositories less; escapes through the tools are error results, not crashes; every episode's
sandbox is closed (on get_reward, reset, a with block and garbage collection) with no bubblewrap left running; a bad JSONL
row names its line and key; and TRL's GRPOTrainer takes `repo_environment` as its environment_factory."""
import gc, json, os
from pathlib import Path

import pytest

from composer_replication import sandbox_local as L
from composer_replication.environments import FAIL_COST, suite_dataset, suite_tasks
from composer_replication.repo_env import RepoEnv, RepoTask, load_repo_tasks, repo_environment, suite_repo_tasks, count_tests
from composer_replication.task_suite import load_expected, make_task_suite

pytestmark = pytest.mark.skipif(L.local_sandbox_unavailable() is not None, reason=f"{L.local_sandbox_unavailable()}")
TOOLS = ["Bash", "Edit", "Glob", "Grep", "Read", "Write"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    "A train split of 8 sessions (fix_bug, rename and add_flag among them), its repositories written to disk."
    d = tmp_path_factory.mktemp("suite")
    make_task_suite(d, n_train=8, n_heldout=0, seed=0)
    tasks = suite_repo_tasks(d/"train", d/"repos", kinds=("task", "recovery"))
    kind = {t.task_id: t.task for t in suite_tasks(d/"train")}
    return d, tasks, kind


def _first(suite, task):
    d, tasks, kind = suite
    return next(t for t in tasks if kind[t.task_id] == task and t.task_id.endswith("::task"))


def _children() -> list[tuple[int, str]]:
    "(pid, command name) of this process's live children: the bubblewrap of any sandbox still open."
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit(): continue
        try: stat = Path(f"/proc/{p}/stat").read_text()
        except OSError: continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if int(rest[1]) == os.getpid() and rest[0] != "Z": out.append((int(p), comm))
    return out


@pytest.mark.parametrize("task", ["fix_bug", "rename", "add_flag"])
def test_recorded_solution_scores_one_and_untouched_less(suite, task):
    "The recorded session's right calls, run through the tools for real, pass every hidden test (and fail where the simulation fails); doing nothing does not."
    from composer_replication.task_suite_repos import SyntheticRepo
    d, tasks, kind = suite
    t = _first(suite, task)
    env = RepoEnv(tasks)
    env.reset(task_id=t.task_id)
    untouched = env.outcome
    assert untouched["tests"] > 0 and untouched["passed"] < untouched["tests"] and env.get_reward() < 1, untouched
    env.reset(task_id=t.task_id)
    sid = t.task_id.split("::")[0]
    sim = SyntheticRepo.from_meta(next(s for s in suite_tasks(d/"train") if s.task_id == t.task_id).meta)
    for row in (r for r in load_expected(d/"train") if r["session_id"] == sid and r["recorded_ok"]):
        for c in row["calls"]:
            text = getattr(env, c["tool"])(**c["args"])
            assert env.calls[-1]["is_error"] == bool(sim.run(c["tool"], c["args"])[1]), (c, text)   # fix_bug's first test run fails, for real too
    o = env.outcome
    assert (o["passed"], o["solved"]) == (o["tests"], True), o
    assert o["reward"] == pytest.approx(1 - FAIL_COST * o["failed_calls"]) and o["failed_calls"] == (task == "fix_bug")


def test_reward_subtracts_the_fail_cost(suite):
    t = _first(suite, "fix_bug")
    env = RepoEnv([t], fail_cost=0.25)
    env.reset(task_id=t.task_id)
    env.Read(file_path=f"{t.cwd}/missing.py"); env.Bash(command="exit 3")
    o = env.outcome
    assert o["failed_calls"] == 2 and o["reward"] == pytest.approx(o["passed"] / o["tests"] - 0.5)
    assert RepoEnv([t]).fail_cost == FAIL_COST


def test_results_match_the_suites_simulation(suite):
    "Read, a failed Edit and a missing file show the strings TaskSuiteEnv's simulation shows for the same calls."
    from composer_replication.environments import replay_calls
    d, tasks, kind = suite
    t = _first(suite, "fix_bug")
    sim = replay_calls(next(s for s in suite_tasks(d/"train") if s.task_id == t.task_id).meta, [])[0]
    env = RepoEnv([t]); env.reset(task_id=t.task_id)
    calls = [("Read", {"file_path": f"{t.cwd}/{sim.mod_path}"}), ("Edit", {"file_path": f"{t.cwd}/{sim.mod_path}", "old_string": "nope", "new_string": "x"}),
             ("Edit", {"file_path": f"{t.cwd}/{sim.init_path}", "old_string": "a", "new_string": "b"}), ("Read", {"file_path": f"{t.cwd}/nope.py"}),
             ("Edit", {"file_path": f"{t.cwd}/{sim.mod_path}", "old_str": "a"}), ("Glob", {"pattern": "**/*.py"})]
    for name, args in calls:
        want, err, _ = sim.run(name, args)
        assert getattr(env, name)(**args) == want, (name, args)
        assert env.calls[-1]["is_error"] == bool(err)
    env._close()


@pytest.mark.parametrize("tool,args", [
    ("Read", {"file_path": "/etc/shadow"}),
    ("Read", {"file_path": "../../../etc/passwd"}),
    ("Read", {"file_path": "{cwd}/../../../../etc/passwd"}),
    ("Read", {"file_path": "{cwd}/escape"}),             # a symbolic link to /etc/passwd made with Bash first
    ("Write", {"file_path": "/tmp/owned.txt", "content": "x"}),
    ("Write", {"file_path": "{cwd}/escape", "content": "x"}),
    ("Edit", {"file_path": "../x.py", "old_string": "a", "new_string": "b"}),
    ("Glob", {"pattern": "../../*"}),
    ("Grep", {"pattern": "root", "path": "/etc"}),
    ("Read", {"file_path": 7}),
    ("Bash", {"command": "cat /etc/shadow"}),
])
def test_escapes_are_error_results(suite, tool, args, tmp_path):
    t = _first(suite, "fix_bug")
    env = RepoEnv([t]); env.reset(task_id=t.task_id)
    env.Bash(command="ln -s /etc/passwd escape")
    args = {k: v.format(cwd=t.cwd) if isinstance(v, str) else v for k, v in args.items()}
    text = getattr(env, tool)(**args)
    assert env.calls[-1]["is_error"], text
    assert "root:" not in text and env.workdir not in text
    env._close()
    assert not Path("/tmp/owned.txt").exists() or Path("/tmp/owned.txt").read_text() != "x"


def test_tool_results_and_errors(suite):
    t = _first(suite, "fix_bug")
    env = RepoEnv([t], timeout_s=2); env.reset(task_id=t.task_id)
    assert env.Write(file_path=f"{t.cwd}/notes.md", content="hi\n") == f"File created successfully at: {t.cwd}/notes.md"
    assert env.Read(file_path="notes.md") == "     1\u2192hi"
    assert env.Write(file_path=f"{t.cwd}/README.md", content="x").startswith("<tool_use_error>File has not been read yet")
    assert env.Bash(command="pwd") == t.cwd                                   # the real folder is never shown
    assert env.Bash(command=f"cat {t.cwd}/notes.md") == "hi"                  # paths under cwd reach the workdir
    assert env.Bash(command="echo out; echo err >&2; exit 2") == "Exit code 2\nout\nerr"
    assert env.Bash(command="sleep 5").startswith("Command timed out after 2s")
    assert env.Grep(pattern="def ").startswith("Found 2 files\n")
    assert env.Grep(pattern="(").startswith("<tool_use_error>Invalid regular expression")
    assert env._call("Frobnicate", {}) == "<tool_use_error>Error: No such tool available: Frobnicate</tool_use_error>"
    assert [c["is_error"] for c in env.calls] == [False, False, True, False, False, True, True, False, True, True]
    env._close()


def test_every_sandbox_is_closed(suite):
    "get_reward, reset, a with block and garbage collection each close the episode's sandbox and remove its copy."
    t = _first(suite, "fix_bug")
    before = _children()
    env = RepoEnv([t])
    assert _children() == before                      # constructing (TRL's probe) starts nothing
    env.reset(task_id=t.task_id); first = env.workdir
    assert len(_children()) == len(before) + 1
    env.reset(task_id=t.task_id)                      # a new episode closes the last one
    assert len(_children()) == len(before) + 1 and not os.path.exists(first)
    env.get_reward(); assert _children() == before and not os.path.exists(env.workdir)
    with pytest.raises(RuntimeError, match="outside an episode"): env.Read(file_path="x")
    with env: env.reset(task_id=t.task_id)
    assert _children() == before
    env.reset(task_id=t.task_id); w = env.workdir
    del env; gc.collect()                             # collected mid-episode
    assert _children() == before and not os.path.exists(w)


@pytest.mark.parametrize("row,match", [
    ("{not json", "line 2: not JSON"),
    ('["a"]', "line 2: a row must be a JSON object"),
    ('{"repo": "r", "prompt": "p"}', "line 2: missing key 'test_command'"),
    ('{"prompt": "p", "test_command": "pytest"}', "line 2: missing key 'repo'"),
    ('{"repo": "nowhere", "prompt": "p", "test_command": "pytest"}', "line 2: key 'repo' must name an existing folder"),
    ('{"repo": "r", "prompt": [], "test_command": "pytest"}', "line 2: key 'prompt'"),
    ('{"repo": "r", "prompt": "p", "test_command": ""}', "line 2: key 'test_command'"),
    ('{"repo": "r", "prompt": "p", "test_command": "pytest", "cwd": "rel"}', "line 2: key 'cwd'"),
    ('{"repo": "r", "prompt": "p", "test_command": "pytest", "task_id": "line-1"}', "task_id 'line-1' appears twice"),
])
def test_jsonl_bad_rows(tmp_path, row, match):
    (tmp_path/"r").mkdir()
    f = tmp_path/"tasks.jsonl"
    f.write_text(json.dumps({"repo": "r", "prompt": "p", "test_command": "pytest"}) + "\n" + row + "\n")
    with pytest.raises(ValueError, match=match.replace("[", r"\[").replace("(", r"\(")): load_repo_tasks(f)


def test_jsonl_task_runs(tmp_path):
    "A user's repository from a JSONL row: its real test command counts its tests."
    (tmp_path/"calc").mkdir()
    (tmp_path/"calc"/"calc.py").write_text("def add(a, b):\n    return a - b\n")
    (tmp_path/"calc"/"test_calc.py").write_text("from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n\ndef test_zero():\n    assert add(0, 0) == 0\n")
    (tmp_path/"t.jsonl").write_text(json.dumps({"repo": "calc", "prompt": "Fix add.", "test_command": "python -m pytest -q", "task_id": "calc"}) + "\n")
    tasks = load_repo_tasks(tmp_path/"t.jsonl")
    env = RepoEnv(tasks)
    assert env.reset(task_id="calc").endswith(f"Working directory: {tmp_path/'calc'}\n</env>")
    env.Read(file_path=f"{tmp_path}/calc/calc.py")
    env.Edit(file_path=f"{tmp_path}/calc/calc.py", old_string="a - b", new_string="a + b")
    assert (env.outcome["passed"], env.outcome["tests"], env.get_reward()) == (2, 2, 1.0)
    assert (tmp_path/"calc"/"calc.py").read_text().endswith("a - b\n")   # the user's folder is untouched


def test_counting_from_summary_and_junit():
    assert count_tests(None, "x\n2 failed, 1 passed, 1 error in 0.1s") == dict(passed=1, failed=2, errors=1, skipped=0)
    assert count_tests("<testsuite tests='3' failures='0' errors='1' skipped='0'/>") == dict(passed=2, failed=0, errors=1, skipped=0)
    assert count_tests("not xml", "1 passed in 0.1s")["passed"] == 1


@pytest.mark.slow
def test_grpo_trainer_takes_it(suite, tmp_path):
    "TRL 1.16 builds the six tools' schemas from the environment's methods and scores rollouts with its get_reward."
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template
    from composer_replication.tiny import tiny_causal_lm, tiny_tokenizer
    t = _first(suite, "fix_bug")
    tok = tiny_tokenizer(); tok.response_template = qwen3_template
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_completion_length=16, max_steps=1,
                      learning_rate=1e-3, report_to=[], use_cpu=True, seed=0, max_tool_calling_iterations=2, save_strategy="no", disable_tqdm=True)
    before = _children()
    trainer = GRPOTrainer(tiny_causal_lm(seed=0), args=args, processing_class=tok, train_dataset=suite_dataset([t]),
                          environment_factory=repo_environment([t]))
    trainer.remove_callback(PrinterCallback)
    assert [f.__name__ for f in trainer.tools] == TOOLS and trainer.reward_func_names == ["RepoEnv"]
    assert _children() == before                      # TRL's probe instance starts no sandbox
    trainer.train()
    log = next(h for h in trainer.state.log_history if "reward" in h)
    assert log["rewards/RepoEnv/mean"] == pytest.approx(2 / 3)   # no tool called: the untouched repository's share
    assert _children() == before                      # every rollout's sandbox closed by its get_reward


def test_recipe_sandbox_from_a_split(suite, tmp_path):
    "grpo: {environment: sandbox, tasks: <split folder>}: the split's repositories written under output_dir/task-repos, one RepoEnv per rollout."
    from composer_replication.recipe import parse_recipe
    from composer_replication.recipe_build import build_trainer, check_recipe
    d, tasks, kind = suite
    r = check_recipe(parse_recipe(f"model: tiny\nmode: grpo\noutput_dir: {tmp_path}/run\ngrpo: {{environment: sandbox, tasks: {d}/train, kinds: [task]}}\n"
                                  "training: {max_steps: 1, per_device_train_batch_size: 2, num_generations: 2, use_cpu: true}\n", tmp_path))
    trainer, _ = build_trainer(r)
    env = trainer.environment_factories[None]()
    assert isinstance(env, RepoEnv) and sorted(trainer.train_dataset["task_id"]) == sorted(t for t in env.tasks)
    assert all(t.endswith("::task") and kind[t] in ("fix_bug", "rename", "add_flag") for t in env.tasks)
    assert all(Path(t.repo).is_relative_to(tmp_path/"run"/"task-repos") for t in env.tasks.values())
