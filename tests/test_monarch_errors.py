"""The Monarch recipe's error cases: every bad argument of its helpers and actors raises, naming what was wrong.

The notebooks (nbs/50b_recipes.monarch.core.ipynb, 50c_recipes.monarch.policy.ipynb, 51_recipes.monarch.actors.ipynb) keep
one or two telling cases beside the code; the rest are here. The actors' arguments are checked with `check_args`, which
needs no Monarch; the cases that go through `spawn_actor`, `local_procs` or `local_actors` need torchmonarch installed
(they fail before any process starts).
"""
from __future__ import annotations

import asyncio
import importlib.util
import math
from types import SimpleNamespace

import pytest

from composer_replication.checks import check_positive_int, check_range
from composer_replication.sample import SCRIPTED_TEACHERS
from composer_replication.loss import LossConfig
from composer_replication.recipes.monarch.actors import (
    MONARCH_AVAILABLE, GeneratorActor, RewarderActor, TeacherPoolActor, TrainerActor, local_actors, local_procs, rollout_examples,
    run_actor_loop, score_completions, spawn_actor)
from composer_replication.recipes.monarch.core import RecipeActor, check_texts

needs_monarch = pytest.mark.skipif(not MONARCH_AVAILABLE, reason="needs torchmonarch (pip install composer-replication[monarch])")


class Toy(RecipeActor):
    "A recipe actor with two checked arguments."
    role = "toy"
    def __init__(self, n:int, scale:float=1.0):
        c = self._setup(dict(n=n, scale=scale)); self.n, self.scale = c["n"], c["scale"]
    @staticmethod
    def _check(n, scale) -> dict: return dict(n=check_positive_int(n, "n"), scale=check_range(scale, "scale"))


def short(prompt, completion): return float(len(completion) <= 3)

LOOP = SimpleNamespace(trainer=1, generator=1, rewarder=1)   # actors the loop's checks never call


def run(coro_fn):
    "Call a function that returns a coroutine, and run it."
    return lambda: asyncio.run(coro_fn())


CASES = {
    # core: the base class, spawning, meshes
    "toy: n below 1": (lambda: Toy.check_args(0), ValueError, "n must be a positive int, got 0"),
    "toy: misspelt keyword": (lambda: Toy.check_args(2, sacle=1), TypeError, "Toy: got an unexpected keyword argument 'sacle'"),
    "toy: scale not a number": (lambda: Toy.check_args(2, scale="big"), TypeError, "scale must be a real number"),
    # check_texts and rollout_examples
    "texts: one str": (lambda: check_texts("ab", "xs"), TypeError, "xs must be a list of strings, got str"),
    "texts: a dict": (lambda: check_texts({"a": 1}, "xs"), TypeError, "xs must be a list of strings, got dict"),
    "texts: an int item": (lambda: check_texts(["a", 2], "xs"), TypeError, "xs[1] must be a str, got int"),
    "texts: empty": (lambda: check_texts([], "xs"), ValueError, "xs is empty"),
    "rollouts: lengths differ": (lambda: rollout_examples(["a", "b"], ["x"], [1, 2]), ValueError, "one entry per rollout"),
    "rollouts: prompts one str": (lambda: rollout_examples("ab", ["x"], [1]), TypeError, "prompts must be a list of strings"),
    "rollouts: nan reward": (lambda: rollout_examples(["a"], ["x"], [math.nan]), ValueError, "rewards[0] must be in (-inf, inf)"),
    "rollouts: inf reward": (lambda: rollout_examples(["a"], ["x"], [math.inf]), ValueError, "rewards[0] must be in (-inf, inf)"),
    "rollouts: str reward": (lambda: rollout_examples(["a"], ["x"], ["1"]), TypeError, "rewards[0] must be a real number"),
    "rollouts: rewards one str": (lambda: rollout_examples(["a"], ["x"], "1"), TypeError, "rewards must be a list of numbers"),
    "rollouts: int completion": (lambda: rollout_examples(["a"], [3], [1]), TypeError, "completions[0] must be a str"),
    "rollouts: no prompts": (lambda: rollout_examples([], [], []), ValueError, "prompts is empty"),
    "rollouts: nan min_advantage": (lambda: rollout_examples(["a"], ["x"], [1], min_advantage=math.nan), ValueError, "min_advantage must be a number"),
    "rollouts: system not str": (lambda: rollout_examples(["a"], ["x"], [1], system=3), TypeError, "system must be a str or None"),
    # the rewarder
    "score: returns a str": (run(lambda: score_completions(lambda p, c: "1", ["a"])), ValueError, "returned '1' for completion 0"),
    "score: returns inf": (run(lambda: score_completions(lambda p, c: math.inf, ["a"])), ValueError, "a finite real number"),
    "score: returns a bool": (run(lambda: score_completions(lambda p, c: True, ["a"])), ValueError, "returned True"),
    "score: prompts for fewer": (run(lambda: score_completions(short, ["a", "b"], ["p"])), ValueError, "prompts has 1 entries for 2"),
    "score: completions one str": (run(lambda: score_completions(short, "ab")), TypeError, "completions must be a list of strings"),
    "rewarder: not callable": (lambda: RewarderActor.check_args([short, 3]), TypeError, "reward_funcs[1] must be callable"),
    "rewarder: a str": (lambda: RewarderActor.check_args("not callable"), TypeError, "reward_funcs must be a callable"),
    "rewarder: no functions": (lambda: RewarderActor.check_args([]), TypeError, "non-empty list"),
    "rewarder: weights for two": (lambda: RewarderActor.check_args([short], weights=[1, 2]), ValueError, "weights has 2 entries for 1"),
    "rewarder: inf weight": (lambda: RewarderActor.check_args([short], weights=[math.inf]), ValueError, "weights[0] must be in (-inf, inf)"),
    "rewarder: weights one number": (lambda: RewarderActor.check_args([short], weights=1), TypeError, "weights must be a list of numbers"),
    "rewarder: misspelt keyword": (lambda: RewarderActor.check_args(short, wieghts=[1]), TypeError,
                                   "RewarderActor: got an unexpected keyword argument 'wieghts'"),
    # the generator
    "generator: no such model": (lambda: GeneratorActor.check_args("no/such/folder"), FileNotFoundError, "neither a built-in student"),
    "generator: model an int": (lambda: GeneratorActor.check_args(3), TypeError, "model must be a student name"),
    "generator: negative temperature": (lambda: GeneratorActor.check_args(temperature=-1), ValueError, "temperature must be in [0, inf)"),
    "generator: inf temperature": (lambda: GeneratorActor.check_args(temperature=math.inf), ValueError, "temperature must be in [0, inf)"),
    "generator: top_p 0": (lambda: GeneratorActor.check_args(top_p=0), ValueError, "top_p must be in (0, 1]"),
    "generator: top_p nan": (lambda: GeneratorActor.check_args(top_p=math.nan), ValueError, "top_p must be in (0, 1]"),
    "generator: unknown engine": (lambda: GeneratorActor.check_args(engine="sglang"), ValueError, "engine must be"),
    "generator: no tokens": (lambda: GeneratorActor.check_args(max_new_tokens=0), ValueError, "max_new_tokens must be a positive int"),
    "generator: negative seed": (lambda: GeneratorActor.check_args(seed=-1), ValueError, "seed must be an int >= 0"),
    "generator: device an int": (lambda: GeneratorActor.check_args(device=0), TypeError, "device must be None, a str or a torch.device"),
    # the trainer
    "trainer: misspelt loss option": (lambda: TrainerActor.check_args(loss_config={"alpha_sdp": 0.5}), ValueError, "did you mean 'alpha_sdpo'"),
    "trainer: taid without t": (lambda: TrainerActor.check_args(loss_config=LossConfig(sdpo_wrapper="taid")), ValueError, "needs a fixed taid_t"),
    "trainer: loss_config a str": (lambda: TrainerActor.check_args(loss_config="dpo"), TypeError, "loss_config must be a LossConfig"),
    "trainer: lr 0": (lambda: TrainerActor.check_args(lr=0), ValueError, "lr must be in (0, inf)"),
    "trainer: lr inf": (lambda: TrainerActor.check_args(lr=math.inf), ValueError, "lr must be in (0, inf)"),
    "trainer: negative weight decay": (lambda: TrainerActor.check_args(weight_decay=-1), ValueError, "weight_decay must be in [0, inf)"),
    "trainer: negative grad norm": (lambda: TrainerActor.check_args(max_grad_norm=-1), ValueError, "max_grad_norm must be in (0, inf) or None"),
    "trainer: hints not a bool": (lambda: TrainerActor.check_args(hints=1), TypeError, "hints must be a bool"),
    "trainer: seed a bool": (lambda: TrainerActor.check_args(seed=True), ValueError, "seed must be an int >= 0"),
    "trainer: no sequence": (lambda: TrainerActor.check_args(max_seq_len=0), ValueError, "max_seq_len must be a positive int"),
    # the teacher pool
    "pool: no teachers": (lambda: TeacherPoolActor.check_args([]), ValueError, "teachers"),
    "pool: negative cap": (lambda: TeacherPoolActor.check_args(SCRIPTED_TEACHERS, max_total_usd=-1), ValueError, "max_total_usd must be in [0, inf)"),
    "pool: own option": (lambda: TeacherPoolActor.check_args(SCRIPTED_TEACHERS, replay_options={"journal": "x"}), ValueError,
                         "replay_options cannot set ['journal']"),
    "pool: unknown option": (lambda: TeacherPoolActor.check_args(SCRIPTED_TEACHERS, replay_options={"max_tokenz": 9}), ValueError,
                             "unknown replay_trace option(s) ['max_tokenz']"),
    "pool: options a list": (lambda: TeacherPoolActor.check_args(SCRIPTED_TEACHERS, replay_options=[1]), TypeError,
                             "replay_options must be a dict or None"),
    "pool: agreement 0": (lambda: TeacherPoolActor.check_args(SCRIPTED_TEACHERS, agreement_threshold=0), ValueError,
                          "agreement_threshold must be a positive int"),
    "pool: base_url an int": (lambda: TeacherPoolActor.check_args(SCRIPTED_TEACHERS, base_url=1), TypeError, "base_url must be a str or None"),
    "pool: api_key an int": (lambda: TeacherPoolActor.check_args(SCRIPTED_TEACHERS, api_key=1), TypeError, "api_key must be a str or None"),
    "pool: journal_dir an int": (lambda: TeacherPoolActor.check_args(SCRIPTED_TEACHERS, journal_dir=1), TypeError, "journal_dir must be a path or None"),
    # the loop
    "loop: no steps": (lambda: run_actor_loop(LOOP, ["p"], steps=0), ValueError, "steps must be a positive int"),
    "loop: sync_every 0": (lambda: run_actor_loop(LOOP, ["p"], sync_every=0), ValueError, "sync_every must be a positive int"),
    "loop: no rewarder": (lambda: run_actor_loop(SimpleNamespace(trainer=1, generator=1), ["p"]), TypeError, "actors has no rewarder actor"),
    "loop: traces without a pool": (lambda: run_actor_loop(LOOP, ["p"], traces=[[]]), ValueError, "traces need a teacher pool"),
    "loop: traces a dict": (lambda: run_actor_loop(SimpleNamespace(trainer=1, generator=1, rewarder=1, teacher_pool=1), ["p"], traces={}),
                            TypeError, "traces must be a list of traces"),
    "loop: no prompts": (lambda: run_actor_loop(LOOP, []), ValueError, "prompts is empty"),
}

MONARCH_CASES = {
    "spawn: before anything is spawned": (lambda: spawn_actor(None, "s", Toy, "two"), ValueError, "n must be a positive int"),
    "spawn: not a recipe actor": (lambda: spawn_actor(None, "s", dict), TypeError, "actor_cls must be one of the recipe's actor classes"),
    "spawn: empty name": (lambda: spawn_actor(None, "", Toy, 2), ValueError, "name must be a non-empty str"),
    "spawn: rewarder not callable": (lambda: spawn_actor(None, "r", RewarderActor, "not callable"), TypeError, "reward_funcs must be a callable"),
    "procs: bad timeout": (lambda: local_procs(spawn_timeout="soon").__enter__(), ValueError, 'spawn_timeout must be a duration like "90s"'),
    "procs: no processes": (lambda: local_procs(0).__enter__(), ValueError, "n must be a positive int"),
    "actors: trainer lr": (lambda: local_actors(short, trainer={"lr": -1}).__enter__(), ValueError, "lr must be in (0, inf)"),
    "actors: pool keywords without teachers": (lambda: local_actors(short, teacher_pool={"max_total_usd": 1}).__enter__(), ValueError,
                                               "without teachers"),
    "actors: keywords a list": (lambda: local_actors(short, generator=[1]).__enter__(), TypeError, "generator must be a dict of keywords"),
}


@pytest.mark.parametrize("fn, exc, msg", CASES.values(), ids=CASES.keys())
def test_error(fn, exc, msg):
    with pytest.raises(exc) as e: fn()
    assert msg in str(e.value), str(e.value)


@needs_monarch
@pytest.mark.parametrize("fn, exc, msg", MONARCH_CASES.values(), ids=MONARCH_CASES.keys())
def test_error_before_spawning(fn, exc, msg):
    with pytest.raises(exc) as e: fn()
    assert msg in str(e.value), str(e.value)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_engine_needs_vllm():
    with pytest.raises(ImportError, match="needs vLLM"): GeneratorActor.check_args(engine="vllm")
