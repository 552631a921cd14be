"""On-policy (issues 26, 38): the student acts in an environment; GRPO + on-policy SDPO (+ replay DPO) learn from its rollouts.

    python experiments/on_policy.py                       # SmolLM2-135M-Instruct in the simulated task suite: a short run
    python experiments/on_policy.py --environment sandbox --sft-steps 60 --budget-s 3600 --steps 1000
                                                          # warm start with SFT until it calls tools, then ~1 h in real sandboxes
    python experiments/on_policy.py --model tiny --steps 2 --out /tmp/op   # the smoke test (the random model calls no tool)

`--environment sandbox` runs every rollout's tools for real (`repo_env.RepoEnv`): each episode is one of the train split's
`fix_bug` / `rename` / `add_flag` sessions from its prompt, its repository copied into a bubblewrap `Sandbox`, and the
reward is the share of the task's tests that pass at the end minus 0.1 per failed call (`do_nothing` in the file: each
episode's reward when nothing is changed, since an untouched repository already passes some of its tests). `--sft-steps N` first trains
the student with plain SFT on the train split's recorded sessions (the same top layers), probing every
`--sft-check-every` steps how many of the episodes' first turns (greedy) hold a well-formed tool call, and stops as
soon as `--sft-until` of them do. `--budget-s` stops the on-policy phase after the step that crosses it.

Every rollout starts at a planted error of a recovery task (`environments.suite_tasks(..., kinds=("recovery",))`): the
recorded prefix ends at the failing tool call, the student writes the next turns, the environment (the suite's simulated
Claude Code tools) answers, and the episode's reward is the task's success in [0, 1] (right first call, task solved) minus
0.1 per failed call. `on_policy.OnPolicyComposerTrainer` adds channel 2 on the student's own rollouts (a hint after
each of its failed calls, with the solution when a rollout of the same task in the group found it) and channel 3 on
pairs at the train split's recovery states (the right call against the recorded distractor). It writes
`on_policy.json` (`on_policy_sandbox.json` for the sandbox: settings, the warm start's probes, per-step times and metrics,
the reward curve) into --out once the warm start is done and again after every on-policy step (`finished` false until the
end), so a run stopped early keeps what it measured.
"""
from __future__ import annotations

import argparse, json, os, sys, tempfile, time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ablation import _commit, _quiet, _versions, say, set_determinism  # noqa: E402


@dataclass
class Settings:
    model: str = "smollm2-135m-instruct"
    device: str = "cpu"
    threads: int = 2
    n_sessions: int = 8          # train sessions of the suite (each gives one recovery task)
    steps: int = 6               # GRPO optimizer steps
    prompts: int = 2             # tasks per step
    generations: int = 4         # rollouts per task (the GRPO group)
    max_completion_length: int = 160
    tool_iterations: int = 2     # tool-calling turns a rollout may take after its first
    train_layers: int = 8        # top decoder layers trained (+ final norm); 0 = every weight
    lr: float = 1e-5
    alpha_sdpo: float = 1.0
    beta_replay: float = 0.1
    max_seq_len: int = 1536      # the trace batches of channel 3
    temperature: float = 1.0
    seed: int = 0
    environment: str = "task_suite"  # task_suite (simulated tools, recovery episodes) or sandbox (RepoEnv: real tools, task episodes)
    sft_steps: int = 0           # warm start: at most this many SFT steps on the train sessions first (0: none)
    sft_lr: float = 1e-4
    sft_check_every: int = 10    # probe the tool-call rate every this many SFT steps
    sft_until: float = 0.75      # ... and stop once this share of the episodes' first turns call a tool
    budget_s: float = 0.0        # stop the on-policy phase after the step that crosses this many seconds (0: --steps alone)


def tool_call_rate(model, tok, prompts:list[list[dict]], tools:list|None, max_new_tokens:int) -> dict:
    "The share of `prompts` whose greedy first turn holds a well-formed tool call, and the calls' names."
    from composer_replication.decoding import next_turn
    from composer_replication.models import parse_tool_calls
    calls = [parse_tool_calls(next_turn(model, tok, msgs, tools, max_new_tokens)["text"]) for msgs in prompts]
    n = sum(map(bool, calls))
    return {"rate": n / len(prompts), "with_call": n, "prompts": len(prompts), "calls": [c["name"] for cs in calls for c in cs]}


def do_nothing(episodes:list) -> dict:
    "Each sandbox episode's reward when the student changes nothing: the share of its tests the untouched repository passes."
    from composer_replication.repo_env import RepoEnv
    per = {}
    for t in episodes:
        env = RepoEnv(episodes); env.reset(task_id=t.task_id); o = env.outcome
        per[t.task_id] = {"passed": o["passed"], "tests": o["tests"], "reward": o["reward"]}
    return {"per_task": per, "mean": sum(v["reward"] for v in per.values()) / len(per), "solved": sum(v["passed"] == v["tests"] for v in per.values())}


def warm_start(model, tok, states:list[dict], probe, s:Settings, work:Path) -> dict:
    "SFT on the recorded sessions (the first channel alone) until `probe()` finds tool calls in `sft_until` of the first turns."
    from transformers import TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback
    from composer_replication.loss import LossConfig
    from composer_replication.trainer.composer_trainer import ComposerOfflineTrainer
    from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator, trace_examples_from_states
    probes = [dict(step=0, **probe())]
    say(f"warm start: before SFT {probes[0]['with_call']}/{probes[0]['prompts']} first turns call a tool")

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step % s.sft_check_every == 0 or state.global_step == s.sft_steps:
                r = dict(step=state.global_step, **probe()); probes.append(r)
                say(f"warm start: after {r['step']} SFT steps {r['with_call']}/{r['prompts']} first turns call a tool")
                if r["rate"] >= s.sft_until: control.should_training_stop = True

    coll = ComposerDataCollator(tok, CollatorConfig(pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0,
                                                    max_seq_len=s.max_seq_len, enable_sdpo=False, enable_replay_dpo=False))
    args = TrainingArguments(output_dir=str(work/"sft"), max_steps=s.sft_steps, per_device_train_batch_size=1, learning_rate=s.sft_lr,
                             lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[], use_cpu=s.device == "cpu",
                             seed=s.seed, data_seed=s.seed, disable_tqdm=True, dataloader_num_workers=0)
    tr = ComposerOfflineTrainer(model, args, train_dataset=trace_examples_from_states(states), data_collator=coll,
                                loss_config=LossConfig(alpha_sdpo=0.0, beta_replay=0.0))
    tr.remove_callback(PrinterCallback); tr.add_callback(Probe())
    t0 = time.perf_counter(); tr.train(); wall = time.perf_counter() - t0
    ce = [h["composer/lm_ce"] for h in tr.state.log_history if "composer/lm_ce" in h]
    return {"steps": tr.state.global_step, "wall_s": wall, "lm_ce_first_last": [ce[0], ce[-1]] if ce else None, "probes": probes,
            "reached": probes[-1]["rate"] >= s.sft_until}


def run(s:Settings, out:Path, work:Path) -> dict:
    import torch
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig
    from trl.chat_template_utils import qwen3_template
    from composer_replication.environments import suite_dataset, suite_environment, suite_tasks
    from composer_replication.hint_generator import dispatch
    from composer_replication.models import load_student, train_top_layers
    from composer_replication.on_policy import OnPolicyComposerTrainer
    from composer_replication.repo_env import RepoEnv, repo_environment, suite_repo_tasks
    from composer_replication.task_suite import load_expected, make_task_suite, suite_ingester
    from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator, trace_examples_from_states
    set_determinism(s.seed, s.device)
    if s.threads: torch.set_num_threads(s.threads)
    commit = _commit()   # the code this run runs: taken once, before later commits can change HEAD under a long run
    make_task_suite(work/"suite", s.n_sessions, 0, seed=0, overwrite=True)
    split = work/"suite"/"train"
    ing, rows = suite_ingester(split), {r["state_id"]: r for r in load_expected(split)}
    states = [st for p in sorted((split/"sessions").glob("*.jsonl")) for st in ing.ingest(p)]
    pairs = [{"state_id": st["state_id"], "state_messages": st["messages"], "chosen": rows[st["state_id"]]["action"],
              "rejected": rows[st["state_id"]]["distractor"], "n_teachers_agreeing": 3}
             for st in states if rows[st["state_id"]]["error_recovery"]]
    if s.environment == "sandbox":
        episodes = suite_repo_tasks(split, work/"repos")   # each session's task from its prompt: fix_bug, rename, add_flag
        factory, probe_tools = repo_environment(episodes), RepoEnv(episodes)
        tools = [getattr(probe_tools, n) for n in ("Read", "Write", "Edit", "Bash", "Glob", "Grep")]
        baseline = do_nothing(episodes)
    elif s.environment == "task_suite":
        tasks = suite_tasks(split)
        episodes = [t for t in tasks if t.kind == "recovery"]
        factory, tools, baseline = suite_environment(tasks), None, None
    else: raise ValueError(f"--environment must be task_suite or sandbox, got {s.environment!r}")
    model, tok = load_student(s.model)
    tok.response_template = qwen3_template   # the students' templates write tool calls as Qwen's do (<tool_call> JSON): TRL parses them so
    trained = train_top_layers(model, s.train_layers) if s.train_layers else None
    probe = lambda: tool_call_rate(model, tok, [t.prompt for t in episodes], tools, s.max_completion_length)
    warm = warm_start(model, tok, states, probe, s, work) if s.sft_steps else None
    times = {"rollout": [], "step": []}
    dest = out/f"on_policy{'_sandbox' if s.environment == 'sandbox' else ''}.json"

    def write(log_history, wall, after, finished):
        res = _results(s, log_history, times, episodes, pairs, trained, warm, after, wall, finished)
        res["do_nothing"], res["commit"] = baseline, commit
        out.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".part"); tmp.write_text(json.dumps(res, indent=1)); tmp.replace(dest)
        return res

    write([], 0.0, None, finished=False)   # the warm start's figures, before the first on-policy step
    t_start = time.perf_counter()

    class Timed(OnPolicyComposerTrainer):
        def _generate(self, prompts):
            t0 = time.perf_counter(); r = super()._generate(prompts); times["rollout"].append(time.perf_counter() - t0); return r

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw): self.t0 = time.perf_counter()
        def on_step_end(self, args, state, control, **kw):
            times["step"].append(time.perf_counter() - self.t0)
            if s.budget_s and time.perf_counter() - t_start > s.budget_s: control.should_training_stop = True
        def on_log(self, args, state, control, logs=None, **kw):   # the figures so far, so that a stopped run keeps them
            if logs and "reward" in logs:
                write(state.log_history, time.perf_counter() - t_start, None, finished=False)
                say(f"on-policy step {state.global_step}: reward {logs['reward']:+.3f}, tool calls a rollout "
                    f"{logs.get('tools/call_frequency', float('nan')):.2f}, sdpo sites {logs.get('on_policy/sites', float('nan')):.0f}")

    args = GRPOConfig(output_dir=str(work/"runs"), per_device_train_batch_size=s.prompts * s.generations, num_generations=s.generations,
                      max_completion_length=s.max_completion_length, max_tool_calling_iterations=s.tool_iterations, max_steps=s.steps,
                      learning_rate=s.lr, temperature=s.temperature, logging_steps=1, report_to=[], use_cpu=s.device == "cpu",
                      seed=s.seed, save_strategy="no", disable_tqdm=True)
    tr = Timed(model, args=args, processing_class=tok, train_dataset=suite_dataset(episodes), environment_factory=factory,
               alpha_sdpo=s.alpha_sdpo, beta_replay=s.beta_replay, trace_dataset=trace_examples_from_states(states, pairs=pairs),
               data_collator=ComposerDataCollator(tok, CollatorConfig(pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0,
                                                                     max_seq_len=s.max_seq_len, hint_generator=dispatch)))
    tr.remove_callback(PrinterCallback); tr.add_callback(StepTimer())
    t0 = time.perf_counter(); tr.train(); wall = time.perf_counter() - t0
    after = probe() if s.sft_steps else None
    return write(tr.state.log_history, wall, after, finished=True)


def _results(s:Settings, log_history:list, times:dict, episodes:list, pairs:list, trained, warm, after, wall:float, finished:bool) -> dict:
    "The run's figures from the trainer's log so far (`finished` False while it trains)."
    logs = [h for h in log_history if "reward" in h]
    keep = ("loss", "reward", "reward_std", "composer/grpo", "composer/sdpo_jsd", "composer/trace_replay_dpo", "env/solved", "env/recovered",
            "env/failed_calls", "env/passed", "env/tests", "on_policy/sites", "on_policy/with_solution", "on_policy/targets",
            "tools/call_frequency", "tools/failure_frequency")
    steps = [{"step": i + 1, "step_s": times["step"][i] if i < len(times["step"]) else None,
              "rollout_s": times["rollout"][i] if i < len(times["rollout"]) else None, **{k: h[k] for k in keep if k in h}}
             for i, h in enumerate(logs)]
    res = {"model": s.model, "environment": s.environment, "settings": asdict(s), "versions": _versions(), "commit": _commit(),
           "episodes": len(episodes), "pairs": len(pairs), "trained": trained["layers"] if trained else "every weight",
           "warm_start": warm, "tool_call_rate_after": after, "finished": finished, "wall_s": wall, "steps": steps,
           "reward_curve": [h.get("reward") for h in logs],
           "median_step_s": sorted(times["step"])[len(times["step"]) // 2] if times["step"] else None,
           "median_rollout_s": sorted(times["rollout"])[len(times["rollout"]) // 2] if times["rollout"] else None}
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f, v in asdict(Settings()).items():
        ap.add_argument("--" + f.replace("_", "-"), type=type(v), default=v)
    ap.add_argument("--out", default=str(HERE/"results"))
    ap.add_argument("--work", default=None, help="where the suite is written (default: a temporary folder)")
    a = vars(ap.parse_args(argv))
    out, work = Path(a.pop("out")), a.pop("work")
    s = Settings(**a)
    if s.prompts < 1 or s.generations < 2 or s.steps < 1: ap.error("--prompts >= 1, --generations >= 2 and --steps >= 1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1"); _quiet()
    work = Path(work) if work else Path(tempfile.mkdtemp(prefix="on-policy-"))
    r = run(s, out, work)
    for st in r["steps"]:
        say(f"step {st['step']}: {st['step_s']:.1f} s (rollouts {st['rollout_s']:.1f} s)  reward {st['reward']:+.3f}  "
            f"solved {st.get('env/solved', float('nan')):.2f}  recovered {st.get('env/recovered', float('nan')):.2f}  "
            f"failed calls {st.get('env/failed_calls', float('nan')):.2f}  sdpo {st.get('composer/sdpo_jsd', float('nan')):.3g}  "
            f"sites {st.get('on_policy/sites', float('nan')):.0f}")
    say(f"{r['model']} ({r['environment']}): {len(r['steps'])} steps in {r['wall_s']:.0f} s; median step {r['median_step_s']:.1f} s, "
        f"median rollout {r['median_rollout_s']:.1f} s; wrote its figures into {out}")


if __name__ == "__main__":
    main()
