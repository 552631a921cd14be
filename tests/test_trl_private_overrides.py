"""`OnPolicyComposerTrainer` overrides three private methods of TRL's `GRPOTrainer`, one adapter class each
(`composer_replication.on_policy`). TRL may change a private method in any release: these tests fail when the installed
TRL no longer has them with the parameters the adapters were written against, or reads and returns what they rely on.
Verified with trl 1.16.0 (settings.ini pins trl>=1.16,<1.17); on a new TRL, read each method and widen the range."""
import inspect

import pytest

trl = pytest.importorskip("trl")
from packaging.version import Version

from composer_replication.on_policy import (OnPolicyComposerTrainer, OnPolicyLossAdapter, OnPolicyRowsAdapter,
                                            RolloutMessagesAdapter)

VERIFIED = (Version("1.16"), Version("1.17"))   # [low, high): the trl releases whose GRPOTrainer the adapters were checked against

# adapter -> (TRL's method, its parameters as the override calls them)
OVERRIDES = {RolloutMessagesAdapter: ("_generate", ["self", "prompts"]),
             OnPolicyRowsAdapter: ("_generate_and_score_completions", ["self", "inputs"]),
             OnPolicyLossAdapter: ("_compute_loss", ["self", "model", "inputs"])}


def test_trl_version_is_one_the_overrides_were_verified_with():
    v = Version(trl.__version__)
    assert VERIFIED[0] <= v < VERIFIED[1], (f"trl {v} is outside [{VERIFIED[0]}, {VERIFIED[1]}): check the private GRPOTrainer "
                                            "methods composer_replication.on_policy overrides, then widen VERIFIED and settings.ini")


@pytest.mark.parametrize("adapter", list(OVERRIDES), ids=lambda a: a.__name__)
def test_trl_private_method_exists_with_the_expected_parameters(adapter):
    name, params = OVERRIDES[adapter]
    assert adapter.trl_method == name
    theirs = getattr(trl.GRPOTrainer, name, None)
    assert callable(theirs), f"trl.GRPOTrainer.{name} is gone (trl {trl.__version__}); {adapter.__name__} overrides it"
    assert list(inspect.signature(theirs).parameters) == params, f"trl.GRPOTrainer.{name}{inspect.signature(theirs)} changed"
    assert list(inspect.signature(getattr(adapter, name)).parameters) == params
    assert getattr(OnPolicyComposerTrainer, name) is getattr(adapter, name)   # the adapter's override is the one that runs


def test_trl_state_the_adapters_read_is_still_there():
    "The attributes the adapters and `_on_policy_rows` read, and the position of the rollouts' messages in `_generate`'s result."
    cls = inspect.getsource(trl.GRPOTrainer)   # __init__ and the helpers it calls
    for attr in ("environments", "tools", "_sync_tool_dicts", "_async_tool_dicts", "_env_tools", "_metrics", "chat_template",
                 "chat_template_kwargs"):
        assert f"self.{attr} =" in cls, f"GRPOTrainer no longer sets self.{attr}"
    gen = inspect.getsource(trl.GRPOTrainer._generate)
    assert "return prompt_ids, completion_ids, tool_mask, completions," in gen   # RolloutMessagesAdapter reads out[3]
    score = inspect.getsource(trl.GRPOTrainer._generate_and_score_completions)
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask"):
        assert f'"{key}"' in score, f"_generate_and_score_completions no longer returns {key!r}"
