"""fuse() over transformers' own causal-LM table: for every model type of
MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, a tiny random model (its config's defaults, shrunk), fused and
compared with the stock model on one training step in float32: the loss and every parameter's
gradient. Prints and writes, per type, what fuse() fused, which fuselet ops ran, and equal or not.

    python benchmarks/zoo.py                      # every type; writes benchmarks/results/zoo.{md,json}
    python benchmarks/zoo.py --types llama,gemma2 --out /tmp/zoo
    scripts/zoo.sh                                # the same through make zoo / pixi run zoo

A type is "equal" when the loss and every gradient agree within TOLERANCE (relative to the
largest magnitude of each), and the fused loss never built the [tokens, vocab] logits where the
head was fused. Types whose model does not build from its shrunk default config, or whose stock
forward fails on plain token ids (models needing images, audio or an encoder), are listed with
the error and do not count.

Each type also goes through transformers' own door: the stock model kernelized
(`set_use_kernels(True)`, what from_pretrained(use_kernels=True) does) with fuselet's kernel
mapping (fuselet.torch.transformers.kernel_mapping), one step against the stock one; the door
reaches only the layers the modeling file marks, and "not marked" types have none of them.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import copy
import inspect
import json
import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
import warnings
from concurrent.futures.process import BrokenProcessPool

TOLERANCE = 1e-5
TIMEOUT_S = 120
MEMORY_LIMIT = 6 << 30  # bytes of address space per worker
B, S, VOCAB = 2, 8, 256

# Liger-Kernel 0.8.5's MODEL_TYPE_TO_APPLY_LIGER_FN (liger_kernel/transformers/monkey_patch.py):
# the model types it patches, for the table's comparison (those that are causal-LM types here).
LIGER_0_8_5 = frozenset(
    "deepseek_v2 deepseek_v3 deepseek_v4 gemma gemma2 gemma3_text gemma3 gemma4_text gemma4 glm4 glm4v glm4v_moe gpt_oss "
    "internvl llama llama4_text llama4 llava granite mllama mllama_text_model ministral mistral mixtral muse_glimmer "
    "nemotron olmo2 pixtral olmo3 qwen2 qwen3 qwen3_moe qwen2_vl qwen2_vl_text qwen2_5_vl qwen2_5_vl_text qwen3_next "
    "qwen3_5 qwen3_5_text qwen3_5_moe qwen3_5_moe_text qwen3_vl qwen3_vl_text qwen3_vl_moe qwen3_vl_moe_text smollm3 "
    "phi3 paligemma falcon_h1 smolvlm hunyuan_v1_dense hunyuan_v1_moe exaone4".split()
)

# make test's sample of the table (`--types sample`; `make zoo` and the nightly workflow run it
# whole): one type of each distinct combination of fused kinds, fuselet ops and door verdict among
# the equal types of benchmarks/results/zoo.md, and the most used of the types Liger-Kernel lists.
SAMPLE = frozenset(
    "afmoe apertus bart beam bloom cohere cpmant deepseek_v4 ergo falcon falcon_mamba flint gemma gemma4 gpt_oss "
    "hy_v4 inkling2_loop_text inkling_text jais2 minimax_m3_vl_text modernbert-decoder nemotron_h phi phimoe "
    "stablelm zamba llama mistral qwen2 qwen3 qwen3_moe mixtral llama4_text phi3".split()
)

# The sizes every config is shrunk to, where its constructor takes the name.
SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=VOCAB,
    max_position_embeddings=128,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
    n_embd=64,
    n_layer=2,
    n_head=4,
    d_model=64,
    num_layers=2,
    ffn_hidden_size=128,
    sliding_window=4,
    pad_token_id=0,
    vocab_size_per_layer_input=VOCAB,
)


# Shrinks tried in turn until the stock model builds and takes a training step: SMALL, then
# without the sizes a model may derive itself (head_dim, sliding_window), then with more layers
# (hybrid models whose first full-attention layer comes later), then with as many key/value heads
# as query heads.
_DERIVED = ("head_dim", "sliding_window")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
SHRINKS = (
    SMALL,
    {k: v for k, v in SMALL.items() if k not in _DERIVED},
    {**{k: v for k, v in SMALL.items() if k not in _DERIVED}, **dict.fromkeys(_LAYERS, 4)},
    {**{k: v for k, v in SMALL.items() if k not in _DERIVED}, **dict.fromkeys(_LAYERS, 8)},
    {k: v for k, v in SMALL.items() if k not in (*_DERIVED, "num_key_value_heads")},  # MLA: one latent for all heads
)


def _accepted(config_cls) -> set:
    return set(inspect.signature(config_cls.__init__).parameters) - {"self", "kwargs"}


def _model_class(model_type: str):
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])


def tiny_config(model_type: str, shrink: dict = SMALL, **overrides):
    from transformers import CONFIG_MAPPING

    # the model class's own config class where it differs (a text model of a composite type)
    config_cls = getattr(_model_class(model_type), "config_class", None) or CONFIG_MAPPING[model_type]
    config = config_cls(**{k: v for k, v in shrink.items() if k in _accepted(config_cls)}, **overrides)
    text = config.get_text_config()
    if text is not config:  # a composite config: shrink its text config too
        small_text = type(text)(**{k: v for k, v in shrink.items() if k in _accepted(type(text))})
        for name, sub in vars(config).items():
            if sub is text:
                setattr(config, name, small_text)
    config._attn_implementation = "eager"
    return config


def build(model_type: str, shrink: dict = SMALL, **overrides):
    import torch

    config = tiny_config(model_type, shrink, **overrides)
    torch.manual_seed(0)
    model = _model_class(model_type)(config).float().eval()  # eval: no dropout (gradients flow all the same)
    with torch.no_grad():  # norms that start at 0 or 1 and zero biases: make them matter
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.2)
    return model


def step(model, input_ids, labels, count=None):
    import torch

    model.zero_grad(set_to_none=True)
    if count is None:
        out = model(input_ids=input_ids, labels=labels)
        out.loss.backward()
    else:
        with count:
            out = model(input_ids=input_ids, labels=labels)
            out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads, torch


def stock_f64(model_type, shrink, input_ids, labels, **overrides):
    """{"loss": ..., parameter: gradient} of the stock model's step in float64, or None."""
    try:
        model = build(model_type, shrink, **overrides).double()
        out, grads, _ = step(model, input_ids, labels)
    except Exception:  # noqa: BLE001 - a model that does not run in float64: no second opinion
        return None
    return {"loss": out.loss, **grads}


def _error(got, want) -> float:
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def check(model_type: str, door: bool = False, **overrides) -> dict:
    """One type's row: built (its config's defaults, shrunk, and `overrides`), fused, compared;
    with `door`, also kernelized with fuselet's kernel mapping (row["door"])."""
    import fuselet.torch as ft
    import torch

    row = {"type": model_type}
    start = time.monotonic()
    failure = None
    for shrink in SHRINKS:
        try:
            model = build(model_type, shrink, **overrides)
        except Exception as e:  # noqa: BLE001 - reported per type
            failure = failure or {"status": "no build", "why": f"{type(e).__name__}: {str(e)[:160]}"}
            continue
        head = model.get_output_embeddings()
        vocab = min(VOCAB, head.out_features) if isinstance(head, torch.nn.Linear) else VOCAB
        g = torch.Generator().manual_seed(1)
        input_ids = torch.randint(1, vocab, (B, S), generator=g)
        labels = input_ids.clone()
        labels[0, :3] = -100
        plain = copy.deepcopy(model)
        unstepped = copy.deepcopy(model) if door else None  # a model may keep non-leaf tensors after a step
        try:
            out_p, grads_p, _ = step(plain, input_ids, labels)
        except Exception as e:  # noqa: BLE001
            if failure is None or failure["status"] == "no build":
                failure = {"status": "no stock step", "why": f"{type(e).__name__}: {str(e)[:160]}"}
            continue
        failure = None
        break
    if failure is not None:
        return {**row, **failure}
    row["class"], row["shrink"] = type(model).__name__, SHRINKS.index(shrink)
    compare = _Compare(model_type, shrink, overrides, input_ids, labels, out_p, grads_p)
    if door:
        row["door"] = _door(unstepped, compare)
    try:
        fused = ft.transformers.fuse(model)
    except ValueError as e:
        return {**row, "status": "nothing fused", "why": str(e)[:300]}
    report = ft.transformers.fuse_report(fused)
    row["fused"] = {k: v["fused"] for k, v in report.summary().items()}
    row["left"] = {k: v["reasons"] for k, v in report.summary().items() if v["left"]}
    row["ops_fused"] = {k: v["ops"] for k, v in report.summary().items() if v["fused"]}

    try:
        out_f, grads_f, ran = counted_step(fused, input_ids, labels)
    except Exception as e:  # noqa: BLE001
        return {**row, "status": "fused step failed", "why": f"{type(e).__name__}: {str(e)[:200]}"}
    row["ops_ran"] = ran
    row.update(compare(out_f, grads_f))
    row["no_logits"] = out_f.logits is None
    head_fused = row["fused"].get("loss", 0) > 0
    if row["status"] == "equal" and head_fused and not row["no_logits"]:
        row["status"] = "differs"
    row["seconds"] = round(time.monotonic() - start, 2)
    return row


def counted_step(model, input_ids, labels):
    """step(), and {fuselet op: calls} of the fuselet ops it ran."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ran = collections.Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name
            if name.startswith("fuselet::"):
                ran[name.removeprefix("fuselet::")] += 1
            return func(*args, **(kwargs or {}))

    out, grads, _ = step(model, input_ids, labels, Count())
    return out, grads, dict(sorted(ran.items()))


class _Compare:
    """A step's loss and gradients against the stock model's: {"status", "max_error", "worst", ...}."""

    def __init__(self, model_type, shrink, overrides, input_ids, labels, out_p, grads_p):
        self.key = (model_type, shrink, input_ids, labels)
        self.input_ids, self.labels = input_ids, labels
        self.overrides = overrides
        self.out_p, self.grads_p = out_p, grads_p
        self.ref = None

    def __call__(self, out_f, grads_f) -> dict:
        out_p, grads_p = self.out_p, self.grads_p
        row = {}
        missing = sorted(set(grads_p) ^ set(grads_f))
        fused_vals = {"loss": out_f.loss, **grads_f}
        stock_vals = {"loss": out_p.loss, **{n: g for n, g in grads_p.items() if n in grads_f}}
        errors = {n: _error(fused_vals[n], v) for n, v in stock_vals.items()}
        worst = max(errors, key=errors.get)
        row["max_error"], row["worst"] = errors[worst], worst
        # Where fused and stock float32 differ by more than TOLERANCE (deep or sensitive models
        # amplify float32's rounding), both are held to the float64 stock step: the fused one may
        # be no further from it than twice the stock float32 step's own distance, plus
        # TOLERANCE: which of two float32 steps lies nearer float64 changes with the CPU kernels
        # torch picks (gemma4's layer-0 k_proj gradient: fused 1.27e-5 from float64, stock
        # 5.4e-6, with AVX-512 kernels; within 2x with AVX2 ones), while a real difference (a
        # wrong eps, a dropped term) is 1e-3 or more.
        if errors[worst] > TOLERANCE and self.ref is None:
            self.ref = stock_f64(*self.key, **self.overrides) or {}
        ref = self.ref if errors[worst] > TOLERANCE else None
        if ref:
            within = [
                n
                for n in errors
                if errors[n] <= TOLERANCE or _error(fused_vals[n], ref[n]) <= 2 * _error(stock_vals[n], ref[n]) + TOLERANCE
            ]
            row["float64_check"] = f"{len(within)} of {len(errors)} within 2x the stock float32 error + {TOLERANCE:g}"
            outside = len(within) < len(errors)
        else:
            outside = errors[worst] > TOLERANCE
        row["status"] = "equal" if not missing and not outside else "differs"
        if missing:
            row["why"] = f"gradients of different parameters: {missing[:4]}"
        return row


def _door(model, compare) -> dict:
    """transformers' own door: the stock model kernelized (model.set_use_kernels, as
    from_pretrained(use_kernels=True) does) with fuselet's kernel mapping, one step against the
    stock one: {"status", "ops_ran", "swapped", ...}; "not marked" where the model marks no layer
    fuselet's repository has, "not swapped" where kernels swapped none of them."""
    import fuselet.torch as ft
    import kernels
    import torch

    names = set(ft.transformers.HUB_LAYERS)
    marked = any(getattr(type(m), "kernel_layer_name", None) in names for m in model.modules())
    marked = marked or any(names & set(vars(m).get("_kernel_funcs", {})) for m in model.modules())
    if not marked:
        return {"status": "not marked"}
    try:
        with kernels.use_kernel_mapping(ft.transformers.kernel_mapping()):
            model.set_use_kernels(True)
        swapped = _swapped(model)
        if not swapped:  # kernels falls back to each layer's own forward where a repository fails to load
            return {"status": "not swapped", "why": "kernels kept every marked layer's own forward"}
        input_ids, labels = compare.input_ids, compare.labels
        with torch.no_grad():  # each layer checks its class once, on its first call: not counted
            model(input_ids=input_ids, labels=labels)
        out, grads, ran = counted_step(model, input_ids, labels)
    except Exception as e:  # noqa: BLE001
        return {"status": "failed", "why": f"{type(e).__name__}: {str(e)[:200]}"}
    return {**compare(out, grads), "ops_ran": ran, "swapped": swapped}


def _swapped(model) -> int:
    """How many modules (and transformers' per-instance function wrappers) run a fuselet layer's forward."""

    def ours(m):
        return getattr(getattr(vars(m).get("forward"), "__func__", None), "__module__", "") == "fuselet.torch.hub.layers"

    return sum(ours(m) + sum(ours(f) for f in vars(m).get("_kernel_funcs", {}).values()) for m in model.modules())


def _timeout(signum, frame):
    raise TimeoutError(f"over {TIMEOUT_S} s")


def _run_one(model_type: str) -> dict:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # A default config that stays huge after shrinking (sub-configs the shrink does not reach)
    # fails its allocation here instead of waking the machine's OOM killer; a call stuck in C
    # code past the alarm ends its worker (the pool then names the type).
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    watchdog = threading.Timer(TIMEOUT_S + 30, os._exit, (3,))
    watchdog.daemon = True
    watchdog.start()
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(TIMEOUT_S)
    try:
        return check(model_type, door=True)
    except Exception as e:  # noqa: BLE001 - one type's failure is its row
        return {"type": model_type, "status": "error", "why": f"{type(e).__name__}: {str(e)[:200]}"}
    finally:
        signal.alarm(0)
        watchdog.cancel()


def _report(row) -> dict:
    if "why" in row:  # one line for the table: error messages may span lines or hold a "|"
        row["why"] = " ".join(row["why"].split()).replace("|", "/")
    print(f"{row['type']:28} {row['status']:16} {row.get('why', '')[:100]}", flush=True)
    return row


def run_all(types, jobs: int) -> list:
    """Every type's row, `jobs` worker processes at a time. A type that kills its worker (a crash
    in the model's code) costs the types in flight their run: those go round again, and the first
    of them runs alone, in a process of its own, until the one that crashes is found and named."""
    context = multiprocessing.get_context("forkserver")
    rows, pending = [], list(types)
    while pending:
        again = []
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
            futures = {pool.submit(_run_one, t): t for t in pending}
            for done in concurrent.futures.as_completed(futures):
                try:
                    rows.append(_report(done.result()))
                except BrokenProcessPool:
                    again.append(futures[done])
        if not again:
            break
        alone = again.pop(0)
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
            try:
                row = pool.submit(_run_one, alone).result()
            except BrokenProcessPool:
                row = {"type": alone, "status": "error", "why": "its process died (a crash in the model's code or out of memory)"}
        rows.append(_report(row))
        pending = again
    return rows


def _door_cell(row) -> str:
    door = row.get("door")
    if door is None or door["status"] == "not marked":
        return "-"
    ran = ", ".join(f"{k} {v}" for k, v in door.get("ops_ran", {}).items()) or "none"
    return f"{door['status']}: {ran}" if "why" not in door else f"{door['status']}: {door['why'][:80]}"


def table(rows) -> str:
    def kinds(row, key):
        return ", ".join(f"{k} {v}" for k, v in row.get(key, {}).items() if v) or "-"

    counts = collections.Counter(r["status"] for r in rows)
    liger = [r for r in rows if r["type"] in LIGER_0_8_5]
    liger_built = [r for r in liger if r["status"] not in ("no build", "no stock step")]
    liger_equal = sum(r["status"] == "equal" for r in liger)
    door = [r for r in rows if r.get("door", {}).get("status", "not marked") != "not marked"]
    door_equal = sum(r["door"]["status"] == "equal" and bool(r["door"].get("ops_ran")) for r in door)
    door_ops = collections.Counter(
        op.removesuffix("_fwd")
        for r in door
        if r["door"]["status"] == "equal"
        for op in r["door"].get("ops_ran", {})
        if op.endswith("_fwd")
    )
    lines = [
        f"Liger-Kernel 0.8.5 lists {len(LIGER_0_8_5)} model types; {len(liger)} are causal-LM types here, "
        f"{len(liger_built)} of them build and step from their shrunk default config, {liger_equal} are equal.",
        "",
        f"transformers' own door (`use_kernels` with fuselet's kernel mapping) reaches {len(door)} types (the others "
        f"mark no layer it has): {door_equal} equal to the stock step with fuselet's ops running "
        f"({', '.join(f'{op} in {n}' for op, n in door_ops.most_common())}), "
        f"{sum(r['door']['status'] == 'equal' for r in door) - door_equal} equal with every marked layer left as it was.",
        "",
        "| type | class | Liger | status | fused (modules) | fuselet ops ran (calls) | max rel. error | door: ops ran |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ran = ", ".join(f"{k} {v}" for k, v in r.get("ops_ran", {}).items()) or "-"
        err = f"{r['max_error']:.1e}" if "max_error" in r else "-"
        status = r["status"] if "why" not in r else f"{r['status']}: {r['why'][:120]}"
        liger_mark = "yes" if r["type"] in LIGER_0_8_5 else ""
        cells = (r["type"], r.get("class", "-"), liger_mark, status, kinds(r, "fused"), ran, err, _door_cell(r))
        lines.append("| " + " | ".join(cells) + " |")
    summary = ", ".join(f"{n} {s}" for s, n in counts.most_common())
    return f"{len(rows)} causal-LM types: {summary}\n\n" + "\n".join(lines) + "\n"


def verdict(rows, min_equal: int, min_door_ops: int) -> list[str]:
    """What fails the run: fewer than `min_equal` types equal; any type that differs from its stock
    model; a type Liger-Kernel lists that builds and steps but is not equal; a type transformers'
    own door reaches that is not equal there; fewer than `min_door_ops` types where fuselet's ops
    ran through that door."""
    failures = []
    equal = sum(r["status"] == "equal" for r in rows)
    if equal < min_equal:
        failures.append(f"{equal} types equal, fewer than --min-equal {min_equal}")
    differs = [r["type"] for r in rows if r["status"] == "differs"]
    if differs:
        failures.append(f"differ from the stock model: {', '.join(differs)}")
    liger = [f"{r['type']} ({r['status']})" for r in rows if r["type"] in LIGER_0_8_5]
    liger = [t for t in liger if not t.endswith(("(equal)", "(no build)", "(no stock step)"))]
    if liger:
        failures.append(f"types Liger-Kernel lists that build and step but are not equal: {', '.join(liger)}")
    door = {r["type"]: r["door"] for r in rows if r.get("door", {}).get("status", "not marked") != "not marked"}
    unequal = [f"{t} ({d['status']})" for t, d in door.items() if d["status"] != "equal"]
    if unequal:
        failures.append(f"not equal through transformers' door: {', '.join(unequal)}")
    ran = sum(bool(d.get("ops_ran")) for d in door.values())
    if ran < min_door_ops:
        failures.append(f"fuselet's ops ran through transformers' door in {ran} types, fewer than --min-door-ops {min_door_ops}")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--types", help="comma-separated model types, or 'sample' (make test's: SAMPLE) (default: every causal-LM type)"
    )
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "zoo"), help="writes OUT.md and OUT.json"
    )
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)")
    parser.add_argument("--min-equal", type=int, default=0, help="exit 1 when fewer types are equal")
    parser.add_argument(
        "--min-door-ops", type=int, default=0, help="exit 1 when fuselet's ops run through transformers' door in fewer types"
    )
    args = parser.parse_args(argv)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = sorted(SAMPLE) if args.types == "sample" else args.types.split(",") if args.types else None
    types = types or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    unknown = [t for t in types if t not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]
    if unknown:
        parser.error(f"--types: not causal-LM model types of this transformers: {', '.join(unknown)}")
    import torch
    import transformers

    rows = run_all(types, args.jobs)
    rows.sort(key=lambda r: r["type"])
    header = f"fuselet {__import__('fuselet').__version__}, torch {torch.__version__}, transformers {transformers.__version__}"
    text = f"# fuse() over transformers' causal LMs\n\n{header}; `python benchmarks/zoo.py`\n\n" + table(rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".md", "w") as f:
        f.write(text)
    with open(args.out + ".json", "w") as f:
        json.dump({"versions": header, "tolerance": TOLERANCE, "rows": rows}, f, indent=1)
        f.write("\n")
    print("\n".join(text.split("\n\n")[2:4]))
    print(f"wrote {args.out}.md and {args.out}.json")
    failures = verdict(rows, args.min_equal, args.min_door_ops)
    for failure in failures:
        print(f"zoo: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
