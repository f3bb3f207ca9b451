"""Bad input to the post-training losses (composed over fused_linear_cross_entropy):
fused_linear_preference_loss, fused_linear_kto_loss and fused_linear_grpo_loss, in both layers."""

from __future__ import annotations

import math

import pytest

from tests.bad_input.conftest import raises

# every bad input of every entry point: part of each smoke run (tests/conftest.py SMOKE_TESTS)
pytestmark = pytest.mark.smoke


def test_fused_linear_preference_loss_rules(api):
    hidden, weight, target = api.array((4, 3, 4)), api.array((5, 4)), api.array((4, 3), "int32")
    loss = api.module.fused_linear_preference_loss
    with raises(ValueError, "loss: expected one of dpo, sigmoid, hinge, ipo, exo_pair, nca_pair, robust, bco_pair"):
        loss(hidden, weight, target, loss="kto")
    with raises(ValueError, "loss: expected DPO's loss types in a list (dpo, sigmoid, hinge, ipo, exo_pair, nca_pair,"):
        loss(hidden, weight, target, loss=["sigmoid", "orpo"])
    with raises(ValueError, "loss_weights: expected 2 weight(s), one per loss type of loss ['ipo', 'sft'], got 3"):
        loss(hidden, weight, target, loss=["ipo", "sft"], loss_weights=[1.0, 2.0, 3.0])
    with raises(ValueError, "ld_alpha: expected None with loss 'simpo' (LD-DPO's weighting"):
        loss(hidden, weight, target, loss="simpo", ld_alpha=0.5)
    with raises(ValueError, "f_divergence_type: expected reverse_kl with loss type 'sppo_hard' (the other f-divergences"):
        loss(hidden, weight, target, loss="sppo_hard", f_divergence_type="alpha_divergence")
    with raises(ValueError, "discopop_tau: expected a number > 0.0, got -1.0"):
        loss(hidden, weight, target, loss="discopop", discopop_tau=-1.0)
    with raises(ValueError, "hidden: expected an even number of sequences > 0 (B chosen, then B rejected), got 3"):
        loss(api.array((3, 3, 4)), weight, api.array((3, 3), "int32"))
    with raises(ValueError, "target: expected shape (4, 3) (the sequences and positions of hidden (4, 3, 4)), got (4, 2)"):
        loss(hidden, weight, api.array((4, 2), "int32"))
    with raises(ValueError, "beta: expected a number > 0.0, got -1.0"):
        loss(hidden, weight, target, beta=-1.0)
    with raises(ValueError, "ref_weight: expected with ref_hidden"):
        loss(hidden, weight, target, ref_hidden=hidden)
    with raises(TypeError, "weight: expected dtype float32 (the dtype of hidden), got bfloat16"):
        loss(hidden, api.array((5, 4), "bfloat16"), target)


def test_fused_linear_kto_loss_rules(api):
    hidden, weight, target = api.array((3, 2, 4)), api.array((5, 4)), api.array((3, 2), "int32")
    labels = api.array((3,), "bool")
    loss = api.module.fused_linear_kto_loss
    with raises(ValueError, "preference_labels: expected shape (3,) (one per sequence of hidden (3, 2, 4)), got (2,)"):
        loss(hidden, weight, target, api.array((2,), "bool"))
    with raises(TypeError, "preference_labels: expected dtype bool (True: desirable, False: undesirable), got float32"):
        loss(hidden, weight, target, api.array((3,)))
    with raises(ValueError, "target: expected shape (3, 2) (the sequences and positions of hidden (3, 2, 4)), got (3, 1)"):
        loss(hidden, weight, api.array((3, 1), "int32"), labels)
    with raises(ValueError, "hidden: expected shape [sequences, T, H], got (6, 4)"):
        loss(api.array((6, 4)), weight, api.array((6,), "int32"), labels)
    with raises(ValueError, "hidden: expected at least one sequence, got shape (0, 2, 4)"):
        loss(api.array((0, 2, 4)), weight, api.array((0, 2), "int32"), api.array((0,), "bool"))
    with raises(ValueError, "kl: expected a scalar (a number or a 0-d array: the KL estimate), got shape (3,)"):
        loss(hidden, weight, target, labels, kl=api.array((3,)))
    with raises(TypeError, "kl: expected a floating-point dtype, got int32"):
        loss(hidden, weight, target, labels, kl=api.array((), "int32"))
    with raises(TypeError, "kl: expected None, a number or a 0-d array (the KL estimate), got str"):
        loss(hidden, weight, target, labels, kl="0.1")
    with raises(ValueError, "kl: expected a finite number, got nan"):
        loss(hidden, weight, target, labels, kl=math.nan)
    with raises(ValueError, "beta: expected a number > 0.0, got 0.0"):
        loss(hidden, weight, target, labels, beta=0.0)
    with raises(ValueError, "desirable_weight: expected a number >= 0.0, got -1.0"):
        loss(hidden, weight, target, labels, desirable_weight=-1.0)
    with raises(ValueError, "undesirable_weight: expected a finite number, got inf"):
        loss(hidden, weight, target, labels, undesirable_weight=math.inf)
    with raises(ValueError, "ref_hidden: expected with ref_weight"):
        loss(hidden, weight, target, labels, ref_weight=weight)
    with raises(ValueError, "ref_hidden: expected shape [3, 2, H_ref] (hidden's sequences and positions), got (2, 2, 4)"):
        loss(hidden, weight, target, labels, ref_hidden=api.array((2, 2, 4)), ref_weight=weight)
    with raises(ValueError, "ref_weight: expected shape [V, 6] (H_ref: the last dimension of ref_hidden (3, 2, 6)), got (5, 4)"):
        loss(hidden, weight, target, labels, ref_hidden=api.array((3, 2, 6)), ref_weight=weight)
    kind = "torch.Tensor" if api.framework == "torch" else "jax.Array"
    with raises(TypeError, f"preference_labels: expected a {kind}, got list"):
        loss(hidden, weight, target, [True, False, True])


def test_fused_linear_grpo_loss_rules(api):
    hidden, weight, target = api.array((2, 3, 4)), api.array((5, 4)), api.array((2, 3), "int32")
    loss = api.module.fused_linear_grpo_loss
    with raises(ValueError, "advantages: expected shape (2,) (one per sequence of hidden (2, 3, 4)), got (3,)"):
        loss(hidden, weight, target, api.array((3,)))
    with raises(ValueError, "ref_logps: expected shape (2, 3) (target's), got (2, 2)"):
        loss(hidden, weight, target, api.array((2,)), ref_logps=api.array((2, 2)))
    with raises(ValueError, "loss_type: expected one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo, got 'gspo'"):
        loss(hidden, weight, target, api.array((2,)), loss_type="gspo")
    with raises(ValueError, "importance_sampling_level: expected one of token, sequence, got 'seq'"):
        loss(hidden, weight, target, api.array((2,)), importance_sampling_level="seq")
    with raises(ValueError, "num_items_in_batch: taken by loss_type dapo, cispo, vespo alone (their normalizer), got"):
        loss(hidden, weight, target, api.array((2,)), num_items_in_batch=4.0)
    with raises(ValueError, "num_items_in_batch: expected a scalar (a number or a 0-d array), got shape (2,)"):
        loss(hidden, weight, target, api.array((2,)), loss_type="dapo", num_items_in_batch=api.array((2,)))
    with raises(ValueError, "temperature: expected a number > 0.0, got 0.0"):
        loss(hidden, weight, target, api.array((2,)), temperature=0.0)
