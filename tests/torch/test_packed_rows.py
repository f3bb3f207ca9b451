"""fuse() on packed rows: several sequences in one row with position ids restarting inside it, as
TRL's SFT collator builds them (`padding_free=True`, and `packing=True`'s `seq_lengths`), fed as
TRL's trainer feeds them (use_cache=False, the flash-style cu_seq_lens / max_length / seq_idx
keywords, num_items_in_batch). transformers turns the restarting position ids into a block-causal
mask for eager and sdpa attention; fuselet's rope reads the per-token cos / sin tables the model
makes from them, and the fused loss shifts the labels as transformers does (TRL marks each
sequence's first token -100, so no token predicts across a boundary)."""

from __future__ import annotations

import copy

import pytest

from tests.conftest import import_layer
from tests.torch.zoo import zoo

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sft = pytest.importorskip("trl.trainer.sft_trainer")
ft = import_layer("torch")

LENGTHS = (5, 7, 4)


def sequences():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(1, zoo.VOCAB, (n,), generator=g).tolist() for n in LENGTHS]


def packed_batch(form):
    """TRL's collated batch of the three sequences in one row."""
    collator = sft.DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    seqs = sequences()
    if form == "padding_free":  # each example one sequence, flattened by the collator
        examples = [{"input_ids": s} for s in seqs]
    else:  # packing=True: one example holding the sequences, with their lengths
        examples = [{"input_ids": sum(seqs, []), "seq_lengths": list(LENGTHS)}]
    batch = collator(examples)
    assert batch["position_ids"].tolist() == [sum((list(range(n)) for n in LENGTHS), [])]
    return batch


def model_pair(model_type, attention):
    plain = zoo.build(model_type)
    plain.set_attn_implementation(attention)
    return plain, ft.transformers.fuse(copy.deepcopy(plain))


def trl_step(model, batch):
    """One step as TRL's SFTTrainer computes it: use_cache=False, the loss summed over the counted
    labels and divided by their number (num_items_in_batch)."""
    model.zero_grad(set_to_none=True)
    count = int((batch["labels"][:, 1:] != -100).sum())
    out = model(**batch, use_cache=False, num_items_in_batch=torch.tensor(count))
    out.loss.backward()
    return out, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("form", ["padding_free", "packing"])
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_fuse_on_packed_rows_equals_stock_and_the_sequences_apart(model_type, form, attention):
    plain, fused = model_pair(model_type, attention)
    batch = packed_batch(form)
    out_p, grads_p = trl_step(plain, batch)
    out_f, grads_f = trl_step(fused, batch)
    assert out_f.logits is None
    assert zoo._error(out_f.loss, out_p.loss) <= zoo.TOLERANCE, (out_f.loss, out_p.loss)
    assert grads_f.keys() == grads_p.keys()
    for name, g in grads_p.items():
        assert zoo._error(grads_f[name], g) <= 2 * zoo.TOLERANCE, name
    # the packed row is the sequences apart: no attention and no prediction across a boundary
    with torch.no_grad():
        apart = [plain(input_ids=torch.tensor([s]), labels=torch.tensor([s])).loss * (len(s) - 1) for s in sequences()]
    assert zoo._error(out_f.loss, sum(apart) / sum(n - 1 for n in LENGTHS)) <= zoo.TOLERANCE


def test_fuse_runs_its_rope_and_loss_on_packed_rows():
    """The packed step above is fuselet's: its rope in every layer and one fused loss ran."""
    from torch.utils._python_dispatch import TorchDispatchMode

    _, fused = model_pair("llama", "sdpa")
    ran = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ran.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    with Count():
        trl_step(fused, packed_batch("padding_free"))
    layers = fused.config.num_hidden_layers
    assert ran.count("fuselet::rope_fwd") == 2 * layers and ran.count("fuselet::rope_bwd") == 2 * layers
    assert ran.count("fuselet::fused_linear_cross_entropy_reduced") == 1
