"""Issue 22 point 5: a model folder whose config.json does not fit its weights is refused with one line, never trained from
random weights; a truncated or corrupt weights file is one line too (through load_student and through a recipe's train)."""
from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest
import torch

from composer_replication.models import load_student
from composer_replication.tiny import tiny_causal_lm, tiny_tokenizer


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    "A tiny student folder that loads: config, weights and tokenizer saved together."
    d = tmp_path_factory.mktemp("models") / "good"
    tiny_causal_lm().save_pretrained(d); tiny_tokenizer().save_pretrained(d)
    return d


def edited(good, tmp_path, **config):
    f = tmp_path / "student"; shutil.copytree(good, f)
    c = json.loads((f / "config.json").read_text()); c.update(config); (f / "config.json").write_text(json.dumps(c))
    return f


def refusal(folder) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(ValueError) as e: load_student(folder)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{folder}: ") and len(msg) < 1000, msg
    return msg


def test_matching_folder_loads_the_same_weights(good):
    m, _ = load_student(good)
    assert torch.equal(m.lm_head.weight, tiny_causal_lm().lm_head.weight)


@pytest.mark.parametrize("config, expect", [
    ({"hidden_size": 128}, "tensor(s) of another shape (lm_head.weight (1030, 64) in the weights vs (1030, 128) from config.json"),
    ({"vocab_size": 2000}, "2 tensor(s) of another shape"),
    ({"intermediate_size": 96}, "tensor(s) of another shape (model.layers.0.mlp.down_proj.weight (64, 128) in the weights vs (64, 96)"),
    ({"num_hidden_layers": 3}, "9 tensor(s) missing from the weights (model.layers.2."),
    ({"num_hidden_layers": 1}, "unexpected tensor(s) in the weights (model.layers.1."),
])
def test_config_that_does_not_fit_the_weights_is_refused(good, tmp_path, config, expect):
    msg = refusal(edited(good, tmp_path, **config))
    assert "config.json (LlamaForCausalLM) does not match the weights" in msg and expect in msg, msg


def test_other_architecture_is_refused(good, tmp_path):
    "A Llama config over GPT-2 weights: every tensor is missing or unexpected."
    from transformers import GPT2Config, GPT2LMHeadModel
    f = tmp_path / "gpt2"; GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=1030)).save_pretrained(f)
    shutil.copy(good / "config.json", f / "config.json"); tiny_tokenizer().save_pretrained(f)
    msg = refusal(f)
    assert "tensor(s) missing from the weights (lm_head.weight" in msg or "missing from the weights (model." in msg, msg
    assert "unexpected tensor(s) in the weights (transformer." in msg, msg


@pytest.mark.parametrize("cut", [lambda b: b[:len(b) // 2], lambda b: b[:50], lambda b: b"\0" * 100, lambda b: b""])
def test_truncated_or_corrupt_weights_are_one_line(good, tmp_path, cut):
    f = edited(good, tmp_path); w = f / "model.safetensors"; w.write_bytes(cut(w.read_bytes()))
    msg = refusal(f)
    assert "cannot load the model (a truncated or corrupt weights file" in msg, msg


def test_train_refuses_a_mismatched_model_folder(good, tmp_path):
    "Through a recipe: the run stops at the model with a RecipeError naming the key and the folder; no model is written."
    from composer_replication.recipe import Recipe, RecipeError
    from composer_replication.recipe_build import load_recipe_model
    f = edited(good, tmp_path, hidden_size=128)
    r = Recipe(model=str(f), output_dir=str(tmp_path / "out"))
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(RecipeError) as e: load_recipe_model(r)
    assert str(e.value).startswith(f"model: cannot load {f}: {f}: config.json (LlamaForCausalLM) does not match the weights"), e.value
    assert not (tmp_path / "out").exists()
