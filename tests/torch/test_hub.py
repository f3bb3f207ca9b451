"""transformers' own door: fuselet's local kernel repository (fuselet/torch/hub) swapped into the
layers transformers marks, by the `kernels` package (model.set_use_kernels, as
from_pretrained(use_kernels=True) does), eager and under torch.compile(fullgraph=True), against
the stock model; each layer's check of the class it replaces; the KernelConfig form."""

from __future__ import annotations

import collections
import copy
import json

import pytest

from tests.conftest import import_layer
from tests.torch.zoo import zoo

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
kernels = pytest.importorskip("kernels")
ft = import_layer("torch")


def batch():
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, zoo.VOCAB, (zoo.B, zoo.S), generator=g)
    return input_ids, input_ids.clone()


def kernelized(model):
    with kernels.use_kernel_mapping(ft.transformers.kernel_mapping()):
        model.set_use_kernels(True)
    return model


def assert_same_step(door, stock, run_door):
    input_ids, labels = batch()
    out_s, grads_s, _ = zoo.step(stock, input_ids, labels)
    door.zero_grad(set_to_none=True)
    out_d = run_door(input_ids=input_ids, labels=labels)
    out_d.loss.backward()
    assert zoo._error(out_d.loss, out_s.loss) <= zoo.TOLERANCE, (out_d.loss, out_s.loss)
    grads_d = {n: p.grad for n, p in door.named_parameters() if p.grad is not None}
    assert grads_d.keys() == grads_s.keys()
    for name, g in grads_s.items():
        assert zoo._error(grads_d[name], g) <= 2 * zoo.TOLERANCE, name


@pytest.mark.parametrize("model_type", ["llama", "gpt_oss", "qwen3_moe"])
def test_door_equal_with_fuselet_ops(model_type):
    """Llama's norms and rope; GPT-OSS's rope over a half-width table; Qwen3-MoE's q / k norms."""
    row = zoo.check(model_type, door=True)
    door = row["door"]
    assert door["status"] == "equal", door
    assert door["ops_ran"].get("rope_fwd", 0) > 0 and door["ops_ran"].get("rope_bwd", 0) > 0, door
    if model_type != "gpt_oss":  # GPT-OSS marks no norm
        assert door["ops_ran"].get("rms_norm_bwd", 0) > 0, door


def test_door_compiled_fullgraph():
    stock = zoo.build("llama")
    door = kernelized(copy.deepcopy(stock))
    assert_same_step(door, stock, torch.compile(door, fullgraph=True))


def test_model_marking_nothing_fuselet_has():
    """OLMo2 marks no norm and no rotary call: the door leaves it, fuse() reaches it by structure."""
    assert zoo.check("olmo2", door=True)["door"] == {"status": "not marked"}


def marked(name):
    return kernels.use_kernel_forward_from_hub(name)


@marked("RMSNorm")
class CenteredNorm(torch.nn.Module):
    """Marked "RMSNorm", but it subtracts the mean: a LayerNorm without bias (ft.layer_norm's form)."""

    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        x = hidden_states - hidden_states.mean(-1, keepdim=True)
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


@marked("RMSNorm")
class MeanAbsNorm(CenteredNorm):
    """Marked "RMSNorm", but it scales by the mean absolute value: no form of fuselet's norms."""

    def forward(self, hidden_states):
        return self.weight * hidden_states / (hidden_states.abs().mean(-1, keepdim=True) + self.variance_epsilon)


@marked("RMSNormZeroCentered")
class ZeroCenteredNorm(torch.nn.Module):
    """Qwen3.5's: scale by (1 + weight), eps as `eps`, through a helper method."""

    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.randn(size) * 0.2)

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return (self._norm(x.float()) * (1.0 + self.weight.float())).type_as(x)


def run_counted(module, x):
    from torch.utils._python_dispatch import TorchDispatchMode

    ran = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ran.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    module(x)  # the layer checks its class on its first call
    with Count():
        y = module(x)
        y.sum().backward()
    return y, [n for n in ran if n.startswith("fuselet::")]


@pytest.mark.parametrize("cls, op", [(CenteredNorm, "layer_norm"), (ZeroCenteredNorm, "rms_norm"), (MeanAbsNorm, None)])
def test_each_class_checked_before_fuselet_runs(cls, op):
    torch.manual_seed(0)
    stock = cls(24, eps=1e-3)
    door = copy.deepcopy(stock)
    with kernels.use_kernel_mapping(ft.transformers.kernel_mapping()):
        kernels.kernelize(door, mode=kernels.Mode.TRAINING, device="cpu")
    assert "forward" in vars(door)  # kernels swapped it
    x = torch.randn(3, 24, requires_grad=True)
    want = stock(x)
    got, ran = run_counted(door, x)
    assert zoo._error(got, want) <= 1e-6
    if op is None:
        assert not ran  # left to its own forward
    else:
        assert ran == [f"fuselet::{op}_fwd", f"fuselet::{op}_bwd"], ran


def test_kernel_config():
    """transformers' KernelConfig of fuselet's layers: its checks pass on a model that marks them;
    transformers 5.25 builds its device mapping for GPUs only (the CPU is refused by transformers
    itself: kernel_mapping() is the CPU's form)."""
    config = ft.transformers.kernel_config()
    model = zoo.build("llama")
    config.sanitize_kernel_mapping(model)
    assert config.use_local_kernel
    assert all(v.startswith(str(ft.transformers.HUB_REPOSITORY)) for v in config.kernel_mapping.values())
    with pytest.raises(ValueError, match="Only devices in"):
        config.create_compatible_mapping(model)


def counting():
    """(a TorchDispatchMode, the Counter it fills with {fuselet op: calls})."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ran = collections.Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._schema.name.startswith("fuselet::"):
                ran[func._schema.name.removeprefix("fuselet::")] += 1
            return func(*args, **(kwargs or {}))

    return Count(), ran


@pytest.fixture
def process_mapping():
    """register_kernels() registers fuselet's layers for the rest of the process; here for the
    rest of the test: an empty use_kernel_mapping around it stands for the process (the
    registration lands in its copy of the mapping, and later tests see the mapping as before)."""
    with kernels.use_kernel_mapping({}):
        yield


def test_register_kernels_survives_train_eval_and_trainer(tmp_path, process_mapping):
    """The CPU's form: register_kernels(), then from_pretrained(use_kernels=True). transformers
    re-kernelizes at each train() / eval() that changes the mode, with the mapping registered
    then; a model loaded inside `with kernels.use_kernel_mapping(kernel_mapping())` lost
    fuselet's layers at the first switch after the block. Here every switch is outside any
    block of fuselet's, and Trainer (which calls train() each step) runs fuselet's ops in the
    forward and the backward of its last step."""
    zoo.build("llama").save_pretrained(tmp_path / "tiny")
    ft.transformers.register_kernels()
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "tiny", use_kernels=True, attn_implementation="eager")
    layers = zoo._swapped(model)
    assert layers == 7, layers  # 2 layers x 2 norms, the final norm, 2 rotary calls
    for switch in (model.train, model.eval, model.train, model.eval):
        switch()
        assert zoo._swapped(model) == layers, switch.__name__

    steps = 3
    count, ran = counting()

    class LastStepCounted(transformers.Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            if self.state.global_step < steps - 1:
                return super().training_step(model, inputs, num_items_in_batch)
            with count:  # the forward and the backward of the last step (not the optimizer's)
                return super().training_step(model, inputs, num_items_in_batch)

    g = torch.Generator().manual_seed(1)
    rows = torch.randint(1, zoo.VOCAB, (2 * steps, zoo.S), generator=g)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=steps,
        per_device_train_batch_size=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    data = [{"input_ids": r, "labels": r.clone()} for r in rows]
    LastStepCounted(model=model, args=args, train_dataset=data).train()
    assert model.training and zoo._swapped(model) == layers
    for op in ("rms_norm_fwd", "rms_norm_bwd", "rope_fwd", "rope_bwd"):
        assert ran[op] > 0, (op, dict(ran))

    model.eval()  # after training, as evaluation or generation would
    assert zoo._swapped(model) == layers
    count, ran = counting()
    with torch.no_grad(), count:
        model(input_ids=rows[:2])
    assert ran["rms_norm_fwd"] > 0 and ran["rope_fwd"] > 0, dict(ran)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="transformers' KernelConfig takes GPU devices only; no CUDA GPU here")
def test_kernel_config_on_cuda():
    stock = zoo.build("llama").cuda()
    door = copy.deepcopy(stock)
    door.set_use_kernels(True, kernel_config=ft.transformers.kernel_config())
    input_ids, labels = (t.cuda() for t in batch())
    want = stock(input_ids=input_ids, labels=labels).loss
    got = door(input_ids=input_ids, labels=labels).loss
    assert zoo._error(got, want) <= 1e-5


def test_repository_metadata():
    """Each build variant's metadata.json records the digest of its files (kernels verifies it at load)."""
    from kernels._rust import Digest, DigestAlgorithm

    for variant in ("torch-cpu", "torch-cuda"):
        path = ft.transformers.HUB_REPOSITORY / variant
        meta = json.loads((path / "metadata.json").read_text())
        assert meta["backend"]["type"] == variant.removeprefix("torch-")
        assert meta["digest"]["files"] == Digest.hash_variant(DigestAlgorithm.SHA256, path).files, (
            f"{path}: refresh metadata.json's digest (python python/fuselet/torch/hub/__main__.py)"
        )


def test_bad_input():
    with pytest.raises(ValueError, match="devices: expected"):
        ft.transformers.kernel_mapping("cpu")
    with pytest.raises(ValueError, match="devices: expected"):
        ft.transformers.kernel_mapping(("cpu", "tpu"))
    with pytest.raises(ValueError, match="layers: expected names among"):
        ft.transformers.kernel_config(["Norm"])
