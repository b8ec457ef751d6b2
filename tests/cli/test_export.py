"""keel export: a checkpoint's model as one float32 model.safetensors (and config.json) that
Hugging Face's GPT2LMHeadModel conventions describe, checked with a small reader
(safetensors_np.py) and an independent GPT-2 forward written below in plain torch operators.

- gpt (vocab from a tiny corpus, context 16, 2 layers, 4 heads, width 32, bias = true), 3 AdamW
  steps (so that biases and LayerNorms leave their initial values), exported from its run
  directory (its newest verified checkpoint) into the default RUN/exports/step-3: the
  directory holds exactly model.safetensors and config.json; the names are exactly
  GPT2LMHeadModel's state dict less lm_head.weight, with GPT-2's shapes, all F32; config.json
  has the fields below; every tensor equals the checkpoint's tensor of the same keel name, the
  attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj weights transposed (Conv1D [in, out]);
- the independent GPT-2 forward (embedding + positions, layer_norm with config's eps, x @ W + b,
  causal softmax attention, the activation config.json names, tied head) on fixed tokens gives
  keel's own logits within 1e-5: keel's are gpt_probe's (tests/plugins/gpt_probe.cpp: the gpt
  plugin's forward in evaluation mode) with the checkpoint's weights loaded (--load); the same
  forward with the tanh GELU ("gelu_new") differs by more than 1e-5, so the check can tell;
- the same model with bias = false trained on 2 ranks (by hand: RANK, WORLD_SIZE, ...),
  exported by naming its checkpoint with --output: the same name set, every bias zeros, the
  same logits within 1e-5;
- a model without export_state (the mlp, checkpointed by the torch backend): keel's names (the
  checkpoint's), no config.json, and the log line saying so; with --weights-from ema, the ema
  hook's average exactly as the checkpoint's hooks.pt holds it (torch.load), not the weights;
- bad input, all in one keel_inproc process (tests/cli/inproc.py): usage errors exit 2 with
  export's usage line, the rest exit 1 with one error line and a hint, and nothing is left
  beside the output (no staging directory), nothing replaced;
- a plugin's export_state (mbx_model of tests/fixtures/misbehave, trained and exported in the
  same keel_inproc process, its plugin directory named with --plugins): its names and
  config.json when it behaves; one error line naming the plugin and the call, and no export
  directory, when it throws, puts a name twice or writes a config.json that is not JSON; without
  --plugins, one error line whose hint names --plugins DIR;
- issue 43 (handed_manifest, since_checks, huge_claimed_model): a plugin placed where the
  checkpoint's manifest points ([plugins] paths) is not loaded (its constructor's mark never
  appears); the default output through a RUN/exports planted as a symlink and an --output
  under a 0777 directory are refused; --since refuses another run's checkpoint (unless
  --since-any-run) and other tables, and reads a torch checkpoint with its own backend; a
  manifest claiming a huge model (checksums redone) is one error line with a peak RSS within
  256 MiB of the tiny checkpoint's own export.

Usage: test_export.py KEEL KEEL_INPROC GPT_PROBE GPT_PLUGIN.so MISBEHAVE_FIXTURE_DIR
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import inproc  # noqa: E402
from handed import recommit  # noqa: E402
import safetensors_np  # noqa: E402
from launching import free_port, without_leak_checks  # noqa: E402

KEEL, INPROC, PROBE, PLUGIN, MISBEHAVE = map(os.path.abspath, sys.argv[1:6])
CTX, LAYERS, HEADS, WIDTH = 16, 2, 4, 32
ATOL = 1e-5
CORPUS = "the quick brown fox jumps over the lazy dog; pack my box with five dozen jugs.\n" * 20
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def keel(*args, env=None):
    return subprocess.run([KEEL, *args], capture_output=True, text=True, env=env)


def manifest(tmp, run, vocab, bias, steps=3):
    path = os.path.join(tmp, run + ".toml")
    with open(path, "w") as f:
        f.write(f"""
[run]
name = "{run}"
seed = 5
threads = 1
output_dir = "{os.path.join(tmp, run)}"
[train]
max_steps = {steps}
log_every = 1
[model]
type = "gpt"
vocab_size = {vocab}
context = {CTX}
layers = {LAYERS}
heads = {HEADS}
width = {WIDTH}
bias = {str(bias).lower()}
[data.train]
type = "tokens"
path = "{os.path.join(tmp, 'data', 'tokens.bin')}"
context = {CTX}
batch_size = 4
[optimizer]
type = "adamw"
lr = 0.01
[loss]
type = "token_cross_entropy"
[checkpoint]
type = "safetensors"
at_end = true
""")
    return path


def hf_shapes(vocab):
    """GPT2LMHeadModel's state dict (less the tied lm_head.weight): name -> shape."""
    c = WIDTH
    out = {"transformer.wte.weight": [vocab, c], "transformer.wpe.weight": [CTX, c],
           "transformer.ln_f.weight": [c], "transformer.ln_f.bias": [c]}
    for i in range(LAYERS):
        h = f"transformer.h.{i}."
        out.update({h + "ln_1.weight": [c], h + "ln_1.bias": [c],
                    h + "attn.c_attn.weight": [c, 3 * c], h + "attn.c_attn.bias": [3 * c],
                    h + "attn.c_proj.weight": [c, c], h + "attn.c_proj.bias": [c],
                    h + "ln_2.weight": [c], h + "ln_2.bias": [c],
                    h + "mlp.c_fc.weight": [c, 4 * c], h + "mlp.c_fc.bias": [4 * c],
                    h + "mlp.c_proj.weight": [4 * c, c], h + "mlp.c_proj.bias": [c]})
    return out


def gpt2_forward(w, cfg, tokens):
    """GPT-2 as transformers' GPT2LMHeadModel computes it (evaluation mode), from the exported
    tensors and config.json alone."""
    c, heads, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    act = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh")}[
        cfg["activation_function"]]
    b, t = tokens.shape
    d = c // heads
    x = w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][:t]
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))

    def split(y):
        return y.view(b, t, heads, d).transpose(1, 2)

    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        h = F.layer_norm(x, (c,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        q, k, v = (h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]).split(c, dim=-1)
        att = (split(q) @ split(k).transpose(-2, -1)) / math.sqrt(d)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ split(v)).transpose(1, 2).reshape(b, t, c)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (c,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = act(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (c,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    assert cfg["tie_word_embeddings"]
    return x @ w["transformer.wte.weight"].T


def keel_logits(tmp, tag, checkpoint, vocab, bias, tokens):
    """gpt_probe's logits: the plugin's forward with the checkpoint's weights (keel's names, in
    the order the checkpoint holds them, which is the model's)."""
    stored = safetensors_np.read_arrays(os.path.join(checkpoint, "model.safetensors"))
    weights = os.path.join(tmp, tag + ".weights.bin")
    with open(weights, "wb") as f:
        for a in stored.values():
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
    batch = os.path.join(tmp, tag + ".tokens.bin")
    np.concatenate([tokens.numpy(), tokens.numpy()]).astype("<i8").tofile(batch)
    out = os.path.join(tmp, tag + ".probe.safetensors")
    r = subprocess.run([PROBE, PLUGIN, "1", "eval", batch, f"{tokens.shape[0]},{tokens.shape[1]}",
                        out, "--threads", "1", "--load", weights, f"vocab_size={vocab}",
                        f"context={CTX}", f"layers={LAYERS}", f"heads={HEADS}",
                        f"width={WIDTH}", f"bias={str(bias).lower()}"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    reply = json.loads(r.stdout)
    check([n for n, s in zip(reply["params"], reply["same_as"]) if s < 0] == list(stored),
          f"{tag}: the checkpoint's tensors are the probe's parameters, in order")
    return torch.from_numpy(safetensors_np.read_arrays(out)["logits"].copy())


def check_export(tmp, tag, out, checkpoint, vocab, bias):
    """The files, names, shapes, config and values of one gpt export; returns the weights."""
    check(sorted(os.listdir(out)) == ["config.json", "model.safetensors"],
          f"{tag}: the export holds model.safetensors and config.json: {os.listdir(out)}")
    raw = safetensors_np.read_raw(os.path.join(out, "model.safetensors"))
    shapes = hf_shapes(vocab)
    check(set(raw) == set(shapes), f"{tag}: names {sorted(set(raw) ^ set(shapes))} differ")
    for name, (dtype, shape, _) in raw.items():
        check(dtype == "F32" and shape == shapes.get(name), f"{tag}: {name} is {dtype} {shape}")
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    expected = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab,
                "n_positions": CTX, "n_ctx": CTX, "n_embd": WIDTH, "n_layer": LAYERS,
                "n_head": HEADS, "n_inner": 4 * WIDTH, "activation_function": "gelu",
                "layer_norm_epsilon": 1e-5, "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0,
                "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "reorder_and_upcast_attn": False, "tie_word_embeddings": True,
                "torch_dtype": "float32"}
    check(cfg == expected, f"{tag}: config.json {cfg}")
    hf = {n: torch.from_numpy(a.copy()) for n, a in
          safetensors_np.read_arrays(os.path.join(out, "model.safetensors")).items()}
    keel_w = {n: torch.from_numpy(a.copy()) for n, a in
              safetensors_np.read_arrays(os.path.join(checkpoint, "model.safetensors")).items()}
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    for name, value in hf.items():
        if name in keel_w:
            ref = keel_w[name].T if name.endswith(conv1d) else keel_w[name]
            check(torch.equal(value, ref), f"{tag}: {name} is the checkpoint's")
        else:
            check(not bias and name.endswith(".bias") and not value.any(),
                  f"{tag}: {name} (not in the checkpoint) is a zero bias of bias = false")
    check(bias or not any(n.endswith(".bias") for n in keel_w), f"{tag}: bias = false has none")
    return hf, cfg


def check_logits(tmp, tag, out, checkpoint, vocab, bias, hf, cfg):
    tokens = torch.tensor([[(7 * i + 3 * j) % vocab for i in range(CTX)] for j in range(3)])
    theirs = gpt2_forward(hf, cfg, tokens)
    ours = keel_logits(tmp, tag, checkpoint, vocab, bias, tokens)
    diff = (theirs - ours).abs().max().item()
    print(f"{tag}: max |GPT-2 logits - keel's| = {diff:.3g} (logits up to "
          f"{ours.abs().max().item():.3g})")
    check(diff <= ATOL, f"{tag}: the independent GPT-2 gives keel's logits within {ATOL}: {diff}")
    tanh = gpt2_forward(hf, dict(cfg, activation_function="gelu_new"), tokens)
    check((tanh - ours).abs().max().item() > ATOL,
          f"{tag}: the tanh GELU gives other logits (the check can tell the two apart)")


def train_two_ranks(path):
    port = free_port()
    procs = []
    for rank in range(2):
        # (Leak checking off under the sanitizers: launching.py says why.)
        env = without_leak_checks({k: v for k, v in os.environ.items() if not k.startswith(
            ("RANK", "WORLD_SIZE", "LOCAL_", "SLURM_", "OMPI_"))})
        env.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        procs.append(subprocess.Popen([KEEL, "train", path], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs):
        check(p.returncode == 0, f"2-rank training: {err[-2000:]}")
    return outs[0][0] + outs[0][1]


def gpt_exports(tmp, vocab):
    # bias = true, one process; exported from the run directory into the default directory.
    run = os.path.join(tmp, "biased")
    r = keel("train", manifest(tmp, "biased", vocab, bias=True))
    check(r.returncode == 0, f"keel train: {r.stderr[-2000:]}")
    checkpoint = os.path.join(run, "checkpoints", "step-3")
    r = keel("export", run, "--format", "safetensors")
    check(r.returncode == 0, f"keel export RUN_DIR: {r.stderr[-2000:]}")
    out = os.path.join(run, "exports", "step-3")
    wrote = f"keel export: wrote {out} (model.safetensors: {len(hf_shapes(vocab))} tensors"
    check(wrote in r.stdout and f"from {checkpoint} (step 3)" in r.stdout,
          f"the line it prints: {r.stdout}")
    hf, cfg = check_export(tmp, "bias", out, checkpoint, vocab, bias=True)
    check_logits(tmp, "bias", out, checkpoint, vocab, True, hf, cfg)
    check(any(n.endswith("attn.c_attn.bias") and hf[n].abs().max() > 1e-4 for n in hf),
          "training moved the biases away from their initial zeros")

    # bias = false on 2 ranks; exported by naming the checkpoint, with --output.
    log = train_two_ranks(manifest(tmp, "unbiased", vocab, bias=False))
    check("rank 0 of 2" in log, f"the run had 2 ranks: {log[-1500:]}")
    checkpoint = os.path.join(tmp, "unbiased", "checkpoints", "step-3")
    out = os.path.join(tmp, "out", "unbiased")
    r = keel("export", checkpoint, "--format", "safetensors", "--output", out)
    check(r.returncode == 0, f"keel export CHECKPOINT --output: {r.stderr[-2000:]}")
    hf, cfg = check_export(tmp, "no-bias", out, checkpoint, vocab, bias=False)
    check_logits(tmp, "no-bias", out, checkpoint, vocab, False, hf, cfg)
    return os.path.join(run, "checkpoints")


def fallback_export(tmp):
    """The mlp has no export_state: keel's names, no config.json."""
    path = os.path.join(tmp, "mlp.toml")
    with open(path, "w") as f:
        f.write(f"""
[run]
name = "mlp"
threads = 1
output_dir = "{os.path.join(tmp, 'mlp')}"
[train]
max_steps = 2
[model]
type = "mlp"
hidden = [8]
[data.train]
type = "fashion_mnist"
limit = 128
batch_size = 64
[optimizer]
type = "adamw"
[loss]
type = "cross_entropy"
[checkpoint]
type = "torch"
at_end = true
[[hooks]]
type = "ema"
decay = 0.5
""")
    r = keel("train", path)
    check(r.returncode == 0, f"keel train (mlp): {r.stderr[-2000:]}")
    r = keel("export", os.path.join(tmp, "mlp"), "--format=safetensors", "-o",
             os.path.join(tmp, "mlp-export"))
    check(r.returncode == 0, f"keel export (mlp): {r.stderr[-2000:]}")
    check("[model] model 'mlp' (plugin keel-models) has no export_state (ABI 1.7): "
          "model.safetensors holds the tensors under keel's names, as checkpoints do, and no "
          "config.json is written" in r.stdout + r.stderr, f"the log says so: {r.stdout}{r.stderr}")
    check(os.listdir(os.path.join(tmp, "mlp-export")) == ["model.safetensors"],
          f"only model.safetensors: {os.listdir(os.path.join(tmp, 'mlp-export'))}")
    arrays = safetensors_np.read_arrays(os.path.join(tmp, "mlp-export", "model.safetensors"))
    check(list(arrays) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
          and all(a.dtype == np.float32 for a in arrays.values()),
          f"keel's names, float32: {[(n, a.dtype, a.shape) for n, a in arrays.items()]}")
    # --weights-from ema: the ema hook's average, as the checkpoint's hooks object holds it
    # (torch.load reads the torch backend's hooks.pt), under the same names; not the weights.
    r = keel("export", os.path.join(tmp, "mlp"), "--format=safetensors", "--weights-from", "ema",
             "-o", os.path.join(tmp, "mlp-ema"))
    check(r.returncode == 0 and "(step 2, hook ema's weights)" in r.stdout,
          f"keel export --weights-from ema: {r.stdout}{r.stderr[-2000:]}")
    ema = safetensors_np.read_arrays(os.path.join(tmp, "mlp-ema", "model.safetensors"))
    hooks = torch.load(os.path.join(tmp, "mlp", "checkpoints", "step-2", "hooks.pt"))
    check(list(ema) == list(arrays) and
          all(np.array_equal(ema[n], hooks["ema." + n].numpy()) for n in ema),
          "--weights-from ema exports the hook's average exactly")
    check(any(not np.array_equal(ema[n], arrays[n]) for n in ema),
          "the average differs from the weights (decay 0.5 over 2 steps)")


def plugin_exports(tmp, pool):
    """mbx_model's export_state, behaving and misbehaving (the line each failure gives)."""
    label = "[model] model 'mbx_model' (plugin misbehave-cpp): export_state"
    cases = [("none", None),
             ("export_throw", f"{label} failed: deliberate failure in export_state"),
             ("export_twice", f"{label} put 'w' twice; every entry needs a unique non-empty "
                              "name and a tensor"),
             ("export_config", f"{label} wrote a config.json that is not JSON (")]
    for fault, says in cases:
        run = os.path.join(tmp, "mbx-" + fault)
        path = run + ".toml"
        with open(path, "w") as f:
            f.write(f"""
[run]
name = "mbx"
threads = 1
output_dir = "{run}"
[plugins]
paths = ["{MISBEHAVE}"]
[train]
max_steps = 1
[model]
type = "mbx_model"
fault = "{fault}"
[data.train]
type = "fashion_mnist"
limit = 64
batch_size = 64
[optimizer]
type = "sgd"
lr = 0.1
[loss]
type = "cross_entropy"
[checkpoint]
type = "safetensors"
at_end = true
""")
        rc, _, err = pool.keel([KEEL, "train", path], cwd=tmp, unset=["KEEL_LOG_LEVEL"])
        check(rc == 0, f"keel train (mbx_model, {fault}): {err}")
        if fault == "none":
            # The checkpoint's [plugins] paths are not searched (handed_manifest): without
            # --plugins, mbx_model is missing, and the hint says how to name its directory.
            rc, out, err = pool.keel([KEEL, "export", run, "--format", "safetensors"], cwd=tmp,
                                     unset=["KEEL_LOG_LEVEL"])
            check(rc == 1 and len(err.strip().splitlines()) == 1
                  and "no model named 'mbx_model'" in err and "--plugins DIR" in err,
                  f"export of mbx_model without --plugins: one line naming --plugins: {err}")
        rc, out, err = pool.keel([KEEL, "export", run, "--format", "safetensors", "--plugins",
                                  MISBEHAVE], cwd=tmp, unset=["KEEL_LOG_LEVEL"])
        exported = os.path.join(run, "exports", "step-1")
        if says is None:
            check(rc == 0, f"keel export (mbx_model): {err}")
            check(sorted(os.listdir(exported)) == ["config.json", "model.safetensors"],
                  f"mbx_model's export: {os.listdir(exported)}")
            with open(os.path.join(exported, "config.json")) as f:
                check(json.load(f) == {"model_type": "mbx"}, "mbx_model's config.json")
            names = safetensors_np.read_raw(os.path.join(exported, "model.safetensors"))
            check(list(names) == ["classifier.weight", "classifier.bias"],
                  f"mbx_model's names: {list(names)}")
            continue
        lines = err.strip().splitlines()
        check(rc == 1 and len(lines) == 1 and lines[0].startswith("keel: error: ")
              and says in lines[0], f"export with {fault}: exit 1 and one line saying {says!r}: "
                                    f"{rc} {err}")
        check(not os.path.exists(os.path.join(run, "exports")),
              f"export with {fault} left {run}/exports behind")


def handed_manifest(tmp, pool):
    """Issue 43, finding 1: a checkpoint's manifest.resolved.toml names a plugin directory
    ([plugins] paths, here the one its run searched) that now holds a plugin whose library
    constructor leaves a mark (tests/fixtures/constructor_lib.c). keel export must not search
    it: the export succeeds with keel's own plugins, says that the checkpoint's directories are
    not searched, and the mark never appears."""
    handed = os.path.join(tmp, "handed")
    cache = os.path.join(handed, ".cache")
    os.makedirs(cache)
    path = os.path.join(handed, "mlp.toml")
    with open(path, "w") as f:
        f.write(f"""
[run]
name = "handed"
threads = 1
output_dir = "{os.path.join(handed, 'run')}"
[plugins]
paths = [".cache"]
[train]
max_steps = 1
[model]
type = "mlp"
hidden = [4]
[data.train]
type = "fashion_mnist"
limit = 64
batch_size = 64
[optimizer]
type = "sgd"
lr = 0.1
[loss]
type = "cross_entropy"
[checkpoint]
type = "safetensors"
at_end = true
""")
    rc, _, err = pool.keel([KEEL, "train", path], cwd=tmp, unset=["KEEL_LOG_LEVEL"])
    check(rc == 0, f"keel train (handed): {err}")
    shutil.copy(os.path.join(os.path.dirname(MISBEHAVE), "constructor_plugin.so"), cache)
    mark = os.path.join(tmp, "constructor-mark")
    rc, out, err = pool.keel([KEEL, "export", os.path.join(handed, "run"), "--format",
                              "safetensors", "--output", os.path.join(handed, "out")],
                             cwd=tmp, env={"KEEL_TEST_CONSTRUCTOR_MARK": mark},
                             unset=["KEEL_LOG_LEVEL"])
    check(not os.path.exists(mark),
          "keel export loaded a plugin from the directory the checkpoint's manifest names "
          "(its constructor ran)")
    check(rc == 0, f"keel export of the handed checkpoint: {rc} {err}")
    check("[plugins] paths" in out + err and "not searched" in out + err,
          f"keel export says that the checkpoint's plugin directories are not searched: "
          f"{out}{err}")
    # Finding 7: the default output (RUN/exports/<checkpoint>) through a symlink planted as
    # RUN/exports, and an --output under a directory others can write: one error line each,
    # nothing written there.
    victim = os.path.join(tmp, "victim-home")
    os.makedirs(victim)
    os.symlink(victim, os.path.join(handed, "run", "exports"))
    shared = os.path.join(tmp, "shared")
    os.makedirs(shared)
    os.chmod(shared, 0o777)
    for output, says in ((None, f"{handed}/run/exports is a symbolic link"),
                         (os.path.join(shared, "out"), f"{shared} is writable by every user")):
        argv = [KEEL, "export", os.path.join(handed, "run"), "--format", "safetensors"]
        rc, out, err = pool.keel(argv + (["--output", output] if output else []), cwd=tmp,
                                 unset=["KEEL_LOG_LEVEL"])
        lines = err.strip().splitlines()
        check(rc == 1 and len(lines) == 1 and says in lines[0] and "hint: " in lines[0],
              f"export to {output or 'the default output'}: one line saying {says!r}: {rc} {err}")
    check(os.listdir(victim) == [] and os.listdir(shared) == [],
          f"nothing written through the symlink or into the shared directory: "
          f"{os.listdir(victim)} {os.listdir(shared)}")


def since_checks(tmp, pool):
    """Issue 43, finding 11: --since takes a checkpoint of the same run (or, with
    --since-any-run, of another run) with the same tables, each read with its own backend. The
    fixture model table_model (tests/fixtures/sparse_table.cpp, one table named by its `table`
    option) from a private copy of its plugin (--plugins):
    - run A (safetensors, checkpoints at steps 1 and 2): step 2 --since step 1 writes a delta;
    - run B (the same model, another run): refused without --since-any-run, naming both runs
      and the flag; with it, written;
    - run T (the same model, another run, the torch backend): with --since-any-run, read with
      the torch backend and written;
    - run C (a table named otherwise): refused, naming both tables, even with --since-any-run.
    Every refusal is one error line and writes nothing."""
    plugins = os.path.join(tmp, "table-plugins")
    os.makedirs(plugins)
    shutil.copy(os.path.join(os.path.dirname(MISBEHAVE), "sparse_table.so"), plugins)

    def train(name, steps, backend="safetensors", table="ids"):
        path = os.path.join(tmp, f"tables-{name}.toml")
        with open(path, "w") as f:
            f.write(f"""
[run]
name = "{name}"
threads = 1
output_dir = "{os.path.join(tmp, 'tables-' + name)}"
[plugins]
paths = ["{plugins}"]
[train]
max_steps = {steps}
[model]
type = "table_model"
table = "{table}"
[data.train]
type = "id_batches"
[optimizer]
type = "sgd"
lr = 0.1
[sparse_optimizer]
type = "adagrad"
lr = 0.5
[loss]
type = "cross_entropy"
[checkpoint]
type = "{backend}"
every_steps = 1
keep_last = 5
""")
        rc, _, err = pool.keel([KEEL, "train", path], cwd=tmp, unset=["KEEL_LOG_LEVEL"])
        check(rc == 0, f"keel train ({name}): {err}")
        return os.path.join(tmp, "tables-" + name, "checkpoints")

    a, b, t, c = train("a", 2), train("b", 1), train("t", 1, backend="torch"), \
        train("c", 1, table="other")
    n = 0

    def export(since, *flags):
        nonlocal n
        n += 1
        out = os.path.join(tmp, f"since-out-{n}")
        rc, _, err = pool.keel([KEEL, "export", os.path.join(a, "step-2"), "--format",
                                "safetensors", "--plugins", plugins, "--since", since,
                                "--output", out, *flags], cwd=tmp, unset=["KEEL_LOG_LEVEL"])
        return rc, err, out

    rc, err, out = export(os.path.join(a, "step-1"))
    check(rc == 0 and os.path.exists(os.path.join(out, "tables.delta.safetensors")),
          f"--since a checkpoint of the same run: {err}")
    for since, flags, says in (
            (os.path.join(b, "step-1"), (), "is of another run"),
            (os.path.join(c, "step-1"), ("--since-any-run",), "not the same tables")):
        rc, err, out = export(since, *flags)
        lines = err.strip().splitlines()
        check(rc == 1 and len(lines) == 1 and says in lines[0] and "hint: " in lines[0]
              and not os.path.exists(out),
              f"--since {since} {flags}: one line saying {says!r}, nothing written: {rc} {err}")
    check("--since-any-run" in export(os.path.join(b, "step-1"))[1],
          "the refusal of another run's checkpoint names --since-any-run")
    check("'ids'" in export(os.path.join(c, "step-1"), "--since-any-run")[1] and
          "'other'" in export(os.path.join(c, "step-1"), "--since-any-run")[1],
          "the refusal of other tables names both")
    for since in (os.path.join(b, "step-1"), os.path.join(t, "step-1")):
        rc, err, out = export(since, "--since-any-run")
        check(rc == 0 and os.path.exists(os.path.join(out, "delta.json")),
              f"--since {since} --since-any-run: {err}")


def huge_claimed_model(tmp):
    """Issue 43, finding 8 (export's half): a handed checkpoint of a tiny mlp (handed_manifest's)
    whose manifest, checksums redone, claims hidden = [8192, 8192, 8192] (0.6 GB of float32
    weights): one error line, and the export's peak RSS (wait4) stays within 256 MiB of the tiny
    checkpoint's own export by the same binary (243 MiB for both in a release build, 396 and
    423 MiB under the sanitizers; building the claimed model first took it to 698 MiB)."""
    src = os.path.join(tmp, "handed", "run", "checkpoints", "step-1")
    ckpt = os.path.join(tmp, "huge-claim")
    shutil.copytree(src, ckpt)
    manifest = os.path.join(ckpt, "manifest.resolved.toml")
    with open(manifest) as f:
        text = f.read()
    check("hidden = [ 4 ]" in text, f"the mlp's hidden in its resolved manifest: {text}")
    with open(manifest, "w") as f:
        f.write(text.replace("hidden = [ 4 ]", "hidden = [ 8192, 8192, 8192 ]"))
    recommit(ckpt)

    def export(checkpoint, out):
        """keel export's exit status, stderr and peak RSS in MiB (wait4)."""
        with tempfile.TemporaryFile() as err:
            p = subprocess.Popen([KEEL, "export", checkpoint, "--format", "safetensors",
                                  "--output", os.path.join(tmp, out)],
                                 stdout=subprocess.DEVNULL, stderr=err)
            _, status, usage = os.wait4(p.pid, 0)
            err.seek(0)
            return (os.waitstatus_to_exitcode(status), err.read().decode(errors="replace"),
                    usage.ru_maxrss / 1024)

    # The tiny model's own export, by the same binary (a sanitizer build takes more of its own).
    tiny_rc, tiny_said, tiny_peak = export(src, "tiny-out")
    check(tiny_rc == 0, f"the tiny checkpoint exports: {tiny_rc} {tiny_said}")
    rc, said, peak = export(ckpt, "huge-out")
    lines = said.strip().splitlines()
    check(rc == 1 and len(lines) == 1 and lines[0].startswith("keel: error: ")
          and ckpt in lines[0] and "does not describe the checkpoint's model" in lines[0]
          and "hint: " in lines[0],
          f"a manifest claiming a huge model: exit 1, one line: {rc} {said}")
    check(peak < tiny_peak + 256, f"a manifest claiming a huge model: peak RSS {peak:.0f} MiB "
          f"(< the tiny export's {tiny_peak:.0f} + 256)")
    print(f"huge claimed model: exit {rc}, peak RSS {peak:.0f} MiB (the tiny export's: "
          f"{tiny_peak:.0f} MiB): {said.strip()}")


def bad_input(tmp, checkpoints, pool):
    """(argv, exit status, what stderr says): usage errors exit 2 with the usage line."""
    run = os.path.dirname(checkpoints)
    damaged = os.path.join(tmp, "damaged")
    shutil.copytree(os.path.join(checkpoints, "step-3"), damaged)
    with open(os.path.join(damaged, "model.safetensors"), "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x01\x02\x03")
    empty_run = os.path.join(tmp, "empty_run")
    os.makedirs(os.path.join(empty_run, "checkpoints"))
    os.makedirs(os.path.join(tmp, "taken"))
    plain = os.path.join(tmp, "plain.txt")
    open(plain, "w").write("x")
    ok = ["--format", "safetensors"]
    cases = [
        (["export"], 2, "keel export: needs RUN_DIR or CHECKPOINT"),
        (["export", run], 2, "keel export: needs --format; hint: keel export runs/<name> "
                             "--format safetensors"),
        (["export", run, "--format", "onnx"], 2, "--format onnx: not a format keel export "
                                                 "writes; hint: --format safetensors"),
        (["export", run, run, *ok], 2, f"{run}: unexpected argument"),
        (["export", "", *ok], 2, "keel export: RUN_DIR|CHECKPOINT is an empty string"),
        (["export", run, "--frmat", "safetensors"], 2, "--frmat: unknown flag"),
        (["export", os.path.join(tmp, "nowhere"), *ok], 1,
         f"{tmp}/nowhere: no such directory; hint: name a run directory"),
        (["export", plain, *ok], 1, f"{plain}: not a directory; hint:"),
        (["export", tmp, *ok], 1, f"{tmp}: neither a checkpoint (no commit.json) nor a run "
                                  "directory (no checkpoints/); hint:"),
        (["export", empty_run, *ok], 1, f"{empty_run}/checkpoints holds no verified checkpoint "
                                        "to export; hint: train the run first"),
        (["export", damaged, *ok], 1, f"checkpoint {damaged} does not verify: "
                                      f"{damaged}/model.safetensors: checksum mismatch"),
        (["export", run, *ok], 1, f"{run}/exports/step-3: exists; keel export writes a new "
                                  "directory and replaces nothing; hint: remove it"),
        (["export", run, *ok, "--output", os.path.join(tmp, "taken")], 1,
         f"{tmp}/taken: exists"),
        (["export", run, *ok, "--since", ""], 2, "--since: an empty path; hint:"),
        (["export", run, *ok, "--plugins", os.path.join(tmp, "nowhere")], 1,
         f"--plugins {tmp}/nowhere: no such directory; hint:"),
        (["export", run, *ok, "--since", run, "--output", os.path.join(tmp, "delta")], 1,
         f"--since {run}: checkpoint {checkpoints}/step-3 holds no sparse tables, so there is "
         "no delta to write; hint: leave --since out"),
        (["export", run, *ok, "--weights-from", "ema", "--output", os.path.join(tmp, "ema")], 1,
         f"--weights-from ema: checkpoint {checkpoints}/step-3 holds no hook state "
         "'ema.transformer.wte.weight'; hint: name the label of a hook that keeps a copy of "
         "every model tensor"),
    ]
    before = sorted(os.listdir(tmp)), sorted(os.listdir(os.path.join(run, "exports")))
    for argv, status, says in cases:
        # argv[0] "keel" (keel on PATH): the hints and the usage line name "keel export".
        rc, out, err = pool.keel(["keel", *argv], cwd=tmp, unset=["KEEL_LOG_LEVEL"])
        shown = " ".join(argv)
        check(rc == status, f"keel {shown}: exit {rc}, expected {status}: {err}")
        check(says in err, f"keel {shown}: stderr says {says!r}: {err}")
        lines = err.strip().splitlines()
        check(lines and lines[0].startswith("keel: error: ") and "hint: " in lines[0]
              and len(lines) == (2 if status == 2 else 1),
              f"keel {shown}: one error line with a hint (and the usage line): {err}")
        if status == 2:
            check(lines[-1].startswith("usage: keel export RUN_DIR|CHECKPOINT [--output DIR] "
                                       "[--since CHECKPOINT] --format safetensors"),
                  f"keel {shown}: usage line: {err}")
    check((sorted(os.listdir(tmp)), sorted(os.listdir(os.path.join(run, "exports")))) == before,
          "the failed exports left nothing behind (no staging directory) and replaced nothing")
    check(os.listdir(os.path.join(tmp, "taken")) == [], "an existing --output stays as it was")


with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "corpus.txt"), "w") as f:
        f.write(CORPUS)
    r = keel("prepare", os.path.join(tmp, "corpus.txt"), "--output", os.path.join(tmp, "data"))
    check(r.returncode == 0, f"keel prepare: {r.stderr}")
    with open(os.path.join(tmp, "data", "vocab.json")) as f:
        V = json.load(f)["size"]
    checkpoints = gpt_exports(tmp, V)
    fallback_export(tmp)
    POOL = inproc.Pool(INPROC, 120)
    try:
        handed_manifest(tmp, POOL)
        since_checks(tmp, POOL)
        huge_claimed_model(tmp)
        bad_input(tmp, checkpoints, POOL)
        plugin_exports(tmp, POOL)
    finally:
        problems = POOL.close()
    check(not problems, f"keel_inproc: {problems}")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
