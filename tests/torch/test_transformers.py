"""fuselet.torch.transformers.fuse on tiny transformers models built from their configs (no
download): the fused instance against an unfused deep copy of itself, per family and dtype."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests import reference as ref
from tests.conftest import import_layer

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
transformers = pytest.importorskip("transformers", reason="transformers is not installed in this environment")
ft = import_layer("torch")

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=64,
)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16, "hidden_act": "gelu_pytorch_tanh"}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "final_logit_softcapping": 30.0}),
}
B, S = 2, 8


def tiny(family: str, dtype=torch.float32, seed: int = 0):
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(**SMALL, **extra)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).to(dtype)
    with torch.no_grad():  # Gemma's norms start at zero weight ((1 + w) = 1): make them matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.3)
    return model


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, SMALL["vocab_size"], (B, S), generator=g)
    labels = input_ids.clone()
    labels[0, :3] = -100  # ignored positions
    return input_ids, labels


def f64(t) -> np.ndarray:
    return t.detach().float().numpy().astype(np.float64)


def run(model, input_ids, labels, step=None):
    out = (model if step is None else step)(input_ids=input_ids, labels=labels)
    out.loss.backward()
    return out, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def fused_here(module) -> bool:
    """fuse() gave this module (or, for a rotary marked for kernels, its own rotary wrapper) a
    forward of its instance."""
    rotary = vars(module).get("_kernel_funcs", {}).values()
    return "forward" in vars(module) or any("forward" in vars(w) for w in rotary)


def assert_same_training_step(fused, plain, dtype: str, compile_fused: bool = False):
    input_ids, labels = batch()
    step_fused = torch.compile(fused, fullgraph=True) if compile_fused else fused
    out_f, grads_f = run(fused, input_ids, labels, step_fused)
    out_p, grads_p = run(plain, input_ids, labels)
    assert out_f.logits is None  # the fused loss never builds them
    # the loss: a mean over tokens of float32 math, compared with the "reduce" tolerance
    ref.assert_close(f64(out_f.loss), f64(out_p.loss), dtype, "reduce", rows=B * S, name="loss")
    assert grads_f.keys() == grads_p.keys() and len(grads_p) == len(list(plain.parameters()))
    for name, g in grads_p.items():
        scale = max(1.0, float(g.detach().float().abs().max()))  # gradients through two layers
        ref.assert_close(f64(grads_f[name]) / scale, f64(g) / scale, dtype, "reduce", rows=B * S, name=name)
    # without labels, the logits as the unfused model gives them
    with torch.no_grad():
        logits_f, logits_p = step_fused(input_ids=input_ids).logits, plain(input_ids=input_ids).logits
    scale = max(1.0, float(logits_p.float().abs().max()))
    ref.assert_close(f64(logits_f) / scale, f64(logits_p) / scale, dtype, "reduce", rows=B * S, name="logits")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_matches_unfused(family, dtype):
    plain = tiny(family, getattr(torch, dtype))
    fused = ft.transformers.fuse(copy.deepcopy(plain))
    swapped = [m for m in fused.modules() if fused_here(m)]
    # every norm (Qwen3's q_norm / k_norm included), MLP and attention, and the LM head's loss
    kinds = {type(m).__name__.removeprefix(type(fused).__name__.removesuffix("ForCausalLM")) for m in swapped}
    assert kinds == {"RMSNorm", "MLP", "Attention", "ForCausalLM"}, kinds
    unswapped = [
        n for n, m in fused.named_modules() if type(m).__name__.endswith(("RMSNorm", "MLP", "Attention")) and not fused_here(m)
    ]
    assert unswapped == []
    assert_same_training_step(fused, plain, dtype)


def test_matches_unfused_compiled():
    """One family under torch.compile (slow on small CPUs): the fused ops inside the compiled graph."""
    torch._dynamo.reset()
    plain = tiny("qwen3")
    fused = ft.transformers.fuse(copy.deepcopy(plain))
    assert_same_training_step(fused, plain, "float32", compile_fused=True)


@pytest.mark.parametrize("tokens", [4, 96])  # fewer than H = 64: two matmuls; more: one on both weights
def test_mlp_both_matmul_paths(tokens):
    config = transformers.LlamaConfig(**SMALL, mlp_bias=True)
    torch.manual_seed(0)
    plain = transformers.models.llama.modeling_llama.LlamaMLP(config)
    wrapper = torch.nn.ModuleDict({"mlp": copy.deepcopy(plain)})
    wrapper.config = config
    fused = ft.transformers.fuse(wrapper)["mlp"]
    assert "forward" in vars(fused)
    x = torch.randn(2, tokens // 2, SMALL["hidden_size"], requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, y2 = fused(x), plain(x2)
    dy = torch.randn_like(y)
    y.backward(dy)
    y2.backward(dy)
    ref.assert_close(f64(y), f64(y2), "float32", name="y")
    ref.assert_close(f64(x.grad), f64(x2.grad), "float32", name="dx")
    for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
        ref.assert_close(f64(p.grad), f64(q.grad), "float32", "reduce", rows=tokens, name=name)


def test_norm_of_mixed_dtypes_falls_back():
    """A float32 Llama norm weight on bfloat16 x: transformers promotes y to float32; fuselet's op
    would not, so that call runs transformers' own forward."""
    plain = transformers.models.llama.modeling_llama.LlamaRMSNorm(SMALL["hidden_size"])
    wrapper = torch.nn.ModuleDict({"norm": copy.deepcopy(plain)})
    wrapper.config = transformers.LlamaConfig(**SMALL)
    fused = ft.transformers.fuse(wrapper)["norm"]
    x = torch.randn(3, SMALL["hidden_size"])
    y = fused(x.bfloat16())
    assert "forward" in vars(fused) and y.dtype == torch.float32 and torch.equal(y, plain(x.bfloat16()))
    ref.assert_close(f64(fused(x)), f64(plain(x)), "float32", name="y")  # one dtype: fuselet's op


def test_lm_head_never_runs_with_labels():
    model = ft.transformers.fuse(tiny("llama"))
    calls = []
    model.lm_head.register_forward_hook(lambda *_: calls.append(1))
    input_ids, labels = batch()
    out = model(input_ids=input_ids, labels=labels)
    out.loss.backward()
    assert calls == [] and out.logits is None and torch.isfinite(out.loss)
    assert model.lm_head.weight.grad is not None
    model(input_ids=input_ids)  # without labels: the ordinary forward, logits and all
    assert calls == [1]


def test_loss_options_match_transformers():
    """shift_labels, num_items_in_batch and return_dict=False as transformers' ForCausalLMLoss takes them."""
    plain = tiny("mistral")
    fused = ft.transformers.fuse(copy.deepcopy(plain))
    input_ids, labels = batch()
    unshifted = labels.flip(-1)  # any targets: shift_labels is used as given
    for kwargs in ({"labels": labels, "shift_labels": unshifted}, {"labels": labels, "num_items_in_batch": torch.tensor(7)}):
        got, want = fused(input_ids=input_ids, **kwargs).loss, plain(input_ids=input_ids, **kwargs).loss
        ref.assert_close(f64(got), f64(want), "float32", "reduce", rows=B * S, name=str(list(kwargs)))
    as_tuple = fused(input_ids=input_ids, labels=labels, return_dict=False)
    assert isinstance(as_tuple, tuple) and as_tuple[0].shape == ()
    with pytest.raises(ValueError, match="logits_to_keep"):
        fused(input_ids=input_ids, labels=labels, logits_to_keep=1)


def test_generate_with_cache():
    """Greedy generate (no labels; cos / sin of one position per step with the KV cache) as unfused."""
    plain = tiny("gemma2")
    fused = ft.transformers.fuse(copy.deepcopy(plain))
    input_ids, _ = batch()
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(fused.generate(input_ids, **kwargs), plain.generate(input_ids, **kwargs))


def test_other_instances_unaffected():
    plain = tiny("gemma")
    other = copy.deepcopy(plain)
    fused = ft.transformers.fuse(copy.deepcopy(plain))
    assert fused is not other
    assert not any(fused_here(m) for m in other.modules())  # the class and its other instances
    assert type(fused) is type(other) and type(fused.model.norm) is type(other.model.norm)
    input_ids, labels = batch()
    a, b = other(input_ids=input_ids, labels=labels), plain(input_ids=input_ids, labels=labels)
    assert a.logits is not None and torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)


def test_state_dict_round_trip():
    plain = tiny("qwen2")
    fused = ft.transformers.fuse(tiny("qwen2", seed=5))
    assert list(fused.state_dict()) == list(plain.state_dict())
    plain.load_state_dict(fused.state_dict(), strict=True)
    fresh = ft.transformers.fuse(tiny("qwen2", seed=7))
    fresh.load_state_dict(plain.state_dict(), strict=True)
    for (name, p), q in zip(fresh.state_dict().items(), fused.state_dict().values()):
        assert torch.equal(p, q), name
    twin = copy.deepcopy(fused)  # a copy's swapped forwards are bound to the copy's modules
    assert twin.model.norm.forward.__self__ is twin.model.norm
    assert twin.model.layers[0].mlp.forward.__self__ is twin.model.layers[0].mlp
    for key, rotary in vars(twin.model.layers[0].self_attn).get("_kernel_funcs", {}).items():
        # transformers' per-instance rotary wrapper (kernels installed): the copy's own
        assert rotary.forward.__self__ is rotary
        assert rotary is not vars(fused.model.layers[0].self_attn)["_kernel_funcs"][key]


def test_flags_choose_the_swaps():
    model = ft.transformers.fuse(tiny("llama"), rms_norm=False, swiglu=True, rope=False, loss=False)
    assert {type(m).__name__ for m in model.modules() if fused_here(m)} == {"LlamaMLP"}
    ft.transformers.fuse(model)  # fusing again adds the rest, keeps the MLPs'
    assert {type(m).__name__ for m in model.modules() if fused_here(m)} == {
        "LlamaMLP",
        "LlamaRMSNorm",
        "LlamaAttention",
        "LlamaForCausalLM",
    }


def test_bad_input():
    nothing = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with pytest.raises(
        ValueError, match=r"model: Sequential \(model_type None\) has no layer fuselet.torch.transformers.fuse can serve"
    ):
        ft.transformers.fuse(nothing)
    assert "forward" not in vars(nothing[0])
    with pytest.raises(ValueError, match=r"model: Sequential was not fused"):
        ft.transformers.fuse_report(nothing)
    with pytest.raises(TypeError, match="model: expected a transformers PreTrainedModel"):
        ft.transformers.fuse("llama")
    with pytest.raises(TypeError, match="rope: expected a bool"):
        ft.transformers.fuse(tiny("llama"), rope="yes")


@pytest.mark.parametrize("version", ["5.23.0", "4.57.6"])
def test_older_transformers_is_refused_by_name(version, monkeypatch):
    model = tiny("llama")
    # the module `import transformers` gives now (transformers may have replaced its lazy module)
    monkeypatch.setattr(sys.modules["transformers"], "__version__", version)
    with pytest.raises(RuntimeError, match=rf"needs transformers >= 5\.24; found {version}\. Fix: pip install"):
        ft.transformers.fuse(model)
    assert not any(fused_here(m) for m in model.modules())  # refused before any swap


def test_import_does_not_import_transformers():
    code = "import sys, fuselet.torch; assert 'transformers' not in sys.modules, 'imported'; print('ok')"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


FSDP_CHILD = textwrap.dedent("""
    import copy, os, sys
    import torch, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    sys.path.insert(0, os.environ["FUSELET_REPO"])
    import fuselet.torch as ft
    from tests.torch.test_transformers import batch, tiny
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    plain = tiny("llama")
    fused = ft.transformers.fuse(copy.deepcopy(plain))
    for layer in fused.model.layers:
        fully_shard(layer)
    fully_shard(fused)
    input_ids, labels = batch(seed=1 + rank)  # one batch per rank
    loss = fused(input_ids=input_ids, labels=labels).loss
    loss.backward()
    # the unfused model on both ranks' batches, gradients averaged as FSDP's reduce-scatter does
    ref_grads = {}
    for r in range(2):
        plain.zero_grad()
        ids, lab = batch(seed=1 + r)
        (plain(input_ids=ids, labels=lab).loss / 2).backward()
        for n, p in plain.named_parameters():
            ref_grads[n] = ref_grads.get(n, 0) + p.grad
    ref_loss = plain(input_ids=input_ids, labels=labels).loss
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for n, p in fused.named_parameters():
        g = p.grad.full_tensor()
        torch.testing.assert_close(g, ref_grads[n], rtol=1e-4, atol=1e-5, msg=n)
    dist.destroy_process_group()
    with open(os.path.join(os.environ["FUSELET_OUT"], f"rank{rank}.ok"), "w") as f:
        f.write("ok")
    # Leave without the interpreter's exit-time destructors: torch 2.14's gloo teardown there may
    # abort a rank ("terminate called without an active exception") after all its work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
""")


def _torchrun(tmp_path, child: str, nproc: int, timeout: int) -> None:
    """Run `child` (a script's text) under torchrun on `nproc` gloo processes on loopback; each
    rank writes rank<r>.ok into FUSELET_OUT once its checks pass (the ranks' stdout interleaves)."""
    script = tmp_path / "child.py"
    script.write_text(child)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FUSELET_REPO": repo, "GLOO_SOCKET_IFNAME": "lo", "FUSELET_OUT": str(tmp_path)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(script)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=repo)
    done = sorted(p.name for p in tmp_path.glob("*.ok"))
    assert done == [f"rank{r}.ok" for r in range(nproc)], out.stdout[-3000:] + out.stderr[-3000:]
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


@pytest.mark.processes
def test_fsdp2_two_processes(tmp_path):
    """fully_shard over a fused model, 2 gloo processes on loopback: loss and gradients as unfused."""
    pytest.importorskip("torch.distributed.fsdp")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    _torchrun(tmp_path, FSDP_CHILD, 2, 240)


TP_CHILD = textwrap.dedent("""
    import copy, os, sys
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    sys.path.insert(0, os.environ["FUSELET_REPO"])
    import fuselet.torch as ft
    from tests.torch.test_transformers import batch, tiny
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    plain = tiny("llama")
    fused = ft.transformers.fuse(copy.deepcopy(plain))
    # Megatron's plan, as transformers' own tp_plan lays it: q/k/v, gate/up by columns, o/down by
    # rows; the lm_head's weight sharded over the vocab
    plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(len(fused.model.layers)):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[f"model.layers.{i}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"model.layers.{i}.{name}"] = RowwiseParallel()
    parallelize_module(fused, mesh, plan)
    input_ids, labels = batch(seed=1)  # the same batch on both ranks: tensor parallel
    input_ids = torch.cat([input_ids] * 8, dim=1)  # tokens >= H: the MLP's one-matmul path would apply
    labels = torch.cat([labels] * 8, dim=1)
    # the fused loss keeps the head sharded: the vocab-parallel loss sees this rank's rows only
    flce = sys.modules["fuselet.torch.fused_linear_cross_entropy"]  # the module (the package exports the function)
    heads, vocab_parallel = [], flce._vocab_parallel
    def spy(hidden, weight, *args):
        heads.append(tuple(weight.shape))
        return vocab_parallel(hidden, weight, *args)
    flce._vocab_parallel = spy
    loss = fused(input_ids=input_ids, labels=labels).loss
    flce._vocab_parallel = vocab_parallel
    V, H = fused.lm_head.weight.shape
    assert heads == [(V // 2, H)], heads
    loss.backward()
    ref_loss = plain(input_ids=input_ids, labels=labels).loss
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    ref = dict(plain.named_parameters())
    for n, p in fused.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        torch.testing.assert_close(g, ref[n].grad, rtol=1e-4, atol=1e-5, msg=n)
    dist.destroy_process_group()
    with open(os.path.join(os.environ["FUSELET_OUT"], f"rank{rank}.ok"), "w") as f:
        f.write("ok")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as FSDP_CHILD: no exit-time gloo teardown
""")


@pytest.mark.processes
def test_tensor_parallel_two_processes(tmp_path):
    """parallelize_module with Megatron's plan over a fused model, the lm_head sharded over the
    vocab, 2 gloo processes: loss and gradients as the unfused model's, the fused loss over each
    rank's rows of the head (vocab-parallel: the head is not gathered)."""
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    _torchrun(tmp_path, TP_CHILD, 2, 240)


FSDP_TP_CHILD = textwrap.dedent("""
    import copy, os, sys
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    sys.path.insert(0, os.environ["FUSELET_REPO"])
    import fuselet.torch as ft
    from tests.torch.test_transformers import batch, tiny
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"].get_local_rank()
    plain = tiny("llama")
    fused = ft.transformers.fuse(copy.deepcopy(plain))
    plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(len(fused.model.layers)):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[f"model.layers.{i}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"model.layers.{i}.{name}"] = RowwiseParallel()
    parallelize_module(fused, mesh["tp"], plan)  # tensor parallel first, then FSDP2 over dp
    for layer in fused.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(fused, mesh=mesh["dp"])
    flce = sys.modules["fuselet.torch.fused_linear_cross_entropy"]
    heads, vocab_parallel = [], flce._vocab_parallel
    def spy(hidden, weight, *args):
        heads.append(tuple(weight.shape))
        return vocab_parallel(hidden, weight, *args)
    flce._vocab_parallel = spy
    opt = torch.optim.SGD(fused.parameters(), lr=0.5)
    ref_opt = torch.optim.SGD(plain.parameters(), lr=0.5)
    def data(step, r):  # one batch per data-parallel rank, the same over tp
        ids, lab = batch(seed=1 + r + 10 * step)
        return torch.cat([ids] * 4, dim=1), torch.cat([lab] * 4, dim=1)  # the same count of labels per batch
    for step in range(3):
        ids, lab = data(step, dp)
        loss = fused(input_ids=ids, labels=lab).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        for r in range(2):  # both dp batches, gradients averaged as FSDP's reduce-scatter does
            ref = plain(input_ids=data(step, r)[0], labels=data(step, r)[1]).loss
            (ref / 2).backward()
            if r == dp:
                torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5, msg=f"step {step}")
        ref_opt.step()
    ref = dict(plain.named_parameters())
    for n, p in fused.named_parameters():
        torch.testing.assert_close(p.full_tensor(), ref[n], rtol=1e-4, atol=1e-5, msg=n)
    V, H = plain.lm_head.weight.shape
    assert heads == [(V // 2, H)] * 3, heads  # the head kept sharded over tp in every step
    dist.destroy_process_group()
    with open(os.path.join(os.environ["FUSELET_OUT"], f"rank{rank}.ok"), "w") as f:
        f.write("ok")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as FSDP_CHILD: no exit-time gloo teardown
""")


@pytest.mark.processes
def test_fsdp2_tensor_parallel_four_processes(tmp_path):
    """A fused Llama on a 2 x 2 (data x tensor) mesh: Megatron's plan over tp (the lm_head sharded
    over the vocab), FSDP2 over dp, 3 SGD steps: each step's loss and the trained parameters as
    the unfused model's on one process, the fused loss over each rank's half of the head."""
    pytest.importorskip("torch.distributed.fsdp")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    _torchrun(tmp_path, FSDP_TP_CHILD, 4, 300)


def test_gradient_checkpointing_matches_stock():
    """transformers' activation checkpointing over a fused model: the same loss and gradients."""
    plain, fused = tiny("llama"), ft.transformers.fuse(tiny("llama"))
    for m in (plain, fused):
        m.train()
        if hasattr(m, "activation_checkpointing_enable"):  # transformers >= 5.25
            m.activation_checkpointing_enable({"use_reentrant": False})
            assert m.is_activation_checkpointing
        else:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            assert m.is_gradient_checkpointing
    input_ids, labels = batch()
    out_f, grads_f = run(fused, input_ids, labels)
    out_p, grads_p = run(plain, input_ids, labels)
    torch.testing.assert_close(out_f.loss, out_p.loss, rtol=1e-5, atol=1e-6)
    for name, g in grads_p.items():
        torch.testing.assert_close(grads_f[name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_rope_runs_fuselets_op(family, monkeypatch):
    """The fused attention calls ft.rope for q and k of every layer (through transformers' rotary
    wrapper of the instance where the class is marked for kernels, else a copy of its forward)."""
    from fuselet.torch.transformers import rotary  # the module whose fused rotary calls ft.rope

    calls = []
    real = rotary.rope

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    model = ft.transformers.fuse(tiny(family))
    monkeypatch.setattr(rotary, "rope", counting)  # counted after fuse()'s probes
    model(input_ids=batch()[0])
    assert len(calls) == 2 * SMALL["num_hidden_layers"]


def test_the_oldest_supported_transformers_is_the_one_ci_tests():
    """requirements/stable-abi.txt pins the oldest transformers fuse() takes; dev's lock the newest."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "requirements", "stable-abi.txt")) as f:
        pins = [line.split("==")[1].strip() for line in f if line.startswith("transformers==")]
    oldest = ".".join(map(str, ft.transformers.OLDEST_TRANSFORMERS))
    assert pins == [f"{oldest}.0"], f"requirements/stable-abi.txt pins transformers {pins}; fuse() takes >= {oldest}"
