"""The gpt model plugin against a PyTorch reference of the same architecture (nanoGPT's model,
written below; python3-torch, the same LibTorch build).

Through gpt_probe (tests/plugins/gpt_probe.cpp: the plugin's model driven by keel/testing.hpp):
- logits on a fixed batch, the mean cross-entropy loss and the gradient of that loss w.r.t.
  every parameter agree with the reference loaded with the plugin's weights: the loss and the
  gradients within an absolute tolerance of 1e-5 (float32; ATOL), the logits within ATOL times
  the largest reference logit's magnitude (at least 1), since their rounding follows the scale
  of the whole tensor, not of each logit (the perturbed cases' logits reach 7.5; on an AMD EPYC
  with AVX-512 and PyTorch 2.11, split_three_threads' logits differed from the reference by up
  to 1.19e-5, where its largest logit is 7.53): at initialisation (context 32, 3 layers, 4 heads,
  width 64), with the weights perturbed by noise of std 0.3, with bias = false on a sequence
  shorter than the context, and with dropout 0.3 in evaluation mode (in training mode dropout
  changes the logits by more than 1e-3); with attention, linear and gelu = "reference"
  (LibTorch's operators) on the perturbed case, with the default fused attention on 3 threads
  (5 (batch, head) pairs), on 1 thread and with a head width of 1, and with the default split
  Linear layers and fused GELU on 3 threads without biases (98 rows in blocks of 32, 33 and 33;
  the GELU's 18,816 values in chunks of 16,384 and 2,432; the full case runs 64 rows in two
  blocks of 32 on 2 threads, with biases); one case (320 rows in 8 blocks, 8 pairs, 2 GELU
  chunks) on 1, 2 and 3 threads, whose logits and gradients must also be equal across the
  three (torch.equal), the LayerNorm parameters' gradients excepted (ATen's layer_norm
  backward adds those up in one part per thread). Each case also checks which kernels ran, from the
  autograd graph behind the logits: one CausalAttention node per layer for "fused", one softmax
  node per layer for "reference" and for dropout in training mode (the fused attention does not
  drop attention weights); for linear = "split" one SplitLinear node per Linear layer and one
  for the output layer, and no addmm; for "reference" each block's four Linear layers with a
  bias as one addmm each (AddmmBackward nodes), as PyTorch's F.linear runs them; one FusedGelu
  node per layer for gelu = "fused", one GeluBackward node for "reference". The cases run on 2 LibTorch threads (gpt_probe
  --threads) unless said, all of them in one `gpt_probe --batch` process
  (tests/plugins/probe.hpp), which a thread drives beside the keel runs below;
- parameter and state names are the reference's state_dict keys, in its order; lm_head.weight
  is the same tensor (TensorImpl) as transformer.wte.weight and no other parameter is shared,
  and its gradient is the reference's tied gradient (both uses summed);
- flops_per_sample equals T * (6N + 12*L*H*Q*T) computed from the reference (N: its parameters,
  the tied weight once, less wpe);
- initialisation: Linear and Embedding weights of mean 0 and std 0.02, attn.c_proj and
  mlp.c_proj of std 0.02 / sqrt(2 layers) (std within 10%, mean within 20% of the std),
  biases 0 and LayerNorm weights 1; the same seed gives the same weights, another seed others;
- width 16 with 3 heads, and a [2, 9] input for context 8, fail with "gpt: width (16) is not
  divisible by heads (3)" and "gpt: expected int64 token ids of shape [batch, time] with
  1 <= time <= context (8), got Long [2, 9]".

Through real `keel train` runs on a tiny character corpus:
- keel trains 3 SGD steps (lr 0.5, no momentum, dropout 0) on sequential windows of the tokens
  dataset from its initial weights, saved as the step-0 checkpoint (safetensors); the reference
  (nanoGPT's model, tied lm_head) loads those weights, trains on the same windows, and every
  step's loss agrees within 1e-5 (relative), and every final parameter within 1e-5 (absolute);
- the same 3 steps with chunked_cross_entropy (chunk_tokens 24), which takes the gpt's final
  hidden states and tied output weight (forward_features, compute_linear; the run log says so,
  and a token_cross_entropy run's log does not): the same losses and final parameters within
  the same tolerances;
- the tied weight is trained once: the checkpoints hold transformer.wte.weight and no
  lm_head.weight, and the reference (where the two are one Parameter) ends with the same values,
  which a double update of the shared tensor would not give;
- the run log says lm_head.weight is shared; flops_per_sample follows T * (6N + 12*L*width*T)
  through the peak_flops MFU (mfu * peak = flops_per_sample * samples/s);
- train.max_tokens plans the run's length from the dataset's tokens per sample (max_tokens
  640 with 4 x 16 tokens per step: the progress line reads "step 10/10" and no step 11 runs);
- a width not divisible by heads, and a window longer than the model's context, fail with one
  line naming the plugin;
- configs/char_gpt.toml trains 12 steps on the fortunes corpus (configs/prepare_fortunes.sh),
  reports bits_per_token = loss / ln 2, and its transformer MFU counts N without wpe.

Every file is in a temporary directory (tempfile).

Usage: test_gpt.py KEEL_BINARY GPT_PROBE GPT_PLUGIN.so
"""
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from probe_batch import Batch

KEEL, PROBE, PLUGIN = sys.argv[1:4]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        a, b = info["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype="<f4").copy()).view(info["shape"])
    return out


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm: a weight and an optional bias."""

    def __init__(self, width, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class Block(nn.Module):
    def __init__(self, width, heads, bias):
        super().__init__()
        self.heads = heads
        self.ln_1 = LayerNorm(width, bias)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(width, 3 * width, bias=bias)
        self.attn.c_proj = nn.Linear(width, width, bias=bias)
        self.ln_2 = LayerNorm(width, bias)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(width, 4 * width, bias=bias)
        self.mlp.c_proj = nn.Linear(4 * width, width, bias=bias)

    def forward(self, x):
        b, t, c = x.shape
        h = self.ln_1(x)
        q, k, v = self.attn.c_attn(h).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.attn.c_proj(y)
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    """nanoGPT's model without dropout (the tests compare with dropout 0 or in eval mode)."""

    def __init__(self, vocab, context, layers, heads, width, bias=True):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, width)
        self.transformer.wpe = nn.Embedding(context, width)
        self.transformer.h = nn.ModuleList(Block(width, heads, bias) for _ in range(layers))
        self.transformer.ln_f = LayerNorm(width, bias)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, idx):
        t = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def flops_per_sample(model, context, layers, heads, width):
    """nanoGPT's estimate_mfu: T (6N + 12 L H Q T), N without wpe, the tied weight once."""
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    return context * (6 * n + 12 * layers * heads * (width // heads) * context)


def keel(*args):
    return subprocess.run([KEEL, *args], capture_output=True, text=True)


# Logits and gradients, through gpt_probe (the plugin's model driven by keel/testing.hpp).
ATOL = 1e-5
DIFFS = []  # (case, "logits" or parameter name, max |keel - reference|)


def probe(tmp, tag, seed, mode, tokens, targets, perturb=0.0, threads=2, **options):
    """One gpt_probe case in the batch process PROBES, on `threads` LibTorch threads; returns (its JSON line, its
    tensors) or (None, its error message) when it fails."""
    path = os.path.join(tmp, tag + ".bin")
    np.concatenate([tokens.numpy().ravel(), targets.numpy().ravel()]).astype("<i8").tofile(path)
    out = os.path.join(tmp, tag + ".safetensors")
    args = ["--threads", threads] + (["--perturb", perturb] if perturb else [])
    args += [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in options.items()]
    text, err = PROBES.run(PLUGIN, seed, mode, path, f"{tokens.shape[0]},{tokens.shape[1]}", out,
                          *args)
    if err is not None:
        return None, err
    return json.loads(text), read_safetensors(out)


def compare(tmp, tag, seed, mode, batch, time, vocab, context, layers, heads, width, bias=True,
            dropout=0.0, perturb=0.0, attention=None, fused=True, linear=None, split=True,
            gelu=None, threads=2):
    """The plugin's logits, loss and every gradient against the reference on the same weights
    (the plugin's initial ones, plus noise of std `perturb`); the model options `attention`,
    `linear` and `gelu` when given. `fused`: whether the plugin's fused attention must have run
    (one CausalAttention autograd node per layer and no softmax node) or its reference attention
    (one softmax node per layer). `split`: whether its split Linear layers must have run (one
    SplitLinear node per Linear layer and one for the output layer) or LibTorch's linear. Its
    GELU is the fused one (one FusedGelu node per layer) unless gelu = "reference"."""
    extra = {k: v for k, v in (("attention", attention), ("linear", linear), ("gelu", gelu))
             if v is not None}
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(vocab, (batch, time), generator=g)
    targets = torch.randint(vocab, (batch, time), generator=g)
    info, t = probe(tmp, tag, seed, mode, tokens, targets, perturb, threads, vocab_size=vocab,
                    context=context, layers=layers, heads=heads, width=width, bias=bias,
                    dropout=dropout, **extra)
    if info is None:
        check(False, f"{tag}: gpt_probe failed: {t}")
        return None, None
    # With linear = "reference", each block's four Linear layers with a bias run as one addmm
    # each, as PyTorch's F.linear runs them (LibTorch's C++ Linear module would run matmul and a
    # separate bias add).
    want = {"CausalAttention": layers if fused else 0, "SoftmaxBackward": 0 if fused else layers,
            "AddmmBackward": 4 * layers if bias and not split else 0,
            "SplitLinear": 4 * layers + 1 if split else 0,
            "FusedGelu": 0 if gelu == "reference" else layers,
            "GeluBackward": layers if gelu == "reference" else 0}
    check(info["graph"] == want and info["threads"] == threads,
          f"{tag}: autograd nodes {info['graph']} on {info['threads']} threads, expected {want} "
          f"on {threads}")
    ref = GPT(vocab, context, layers, heads, width, bias)
    names = list(ref.state_dict())  # nanoGPT's names; lm_head.weight (tied) last
    check(info["params"] == names, f"{tag}: parameter names {info['params']} vs {names}")
    check(info["state"] == names, f"{tag}: state names {info['state']}")
    # The tied weight: lm_head.weight is the same tensor as transformer.wte.weight, and no other
    # parameter is shared.
    wte = names.index("transformer.wte.weight")
    want_same = [wte if n == "lm_head.weight" else -1 for n in names]
    check(info["same_as"] == want_same, f"{tag}: shared parameters {info['same_as']}")
    ref.load_state_dict({n: t["param/" + n] for n in info["params"]}, strict=True)
    check(flops_per_sample(ref, context, layers, heads, width) == info["flops_per_sample"],
          f"{tag}: flops_per_sample {info['flops_per_sample']} vs "
          f"{flops_per_sample(ref, context, layers, heads, width)}")
    logits = ref(tokens)
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    d = (t["logits"] - logits.detach()).abs().max().item()
    DIFFS.append((tag, "logits", d))
    bound = ATOL * max(1.0, logits.detach().abs().max().item())
    check(t["logits"].shape == (batch, time, vocab) and d <= bound,
          f"{tag}: logits differ by {d} (more than {bound})")
    check(abs(info["loss"] - loss.item()) <= ATOL, f"{tag}: loss {info['loss']} vs {loss.item()}")
    params = dict(ref.named_parameters())  # the tied weight once, as transformer.wte.weight
    params["lm_head.weight"] = ref.lm_head.weight
    for n in names:
        if "grad/" + n not in t:
            check(False, f"{tag}: {n} has no gradient")
            continue
        d = (t["grad/" + n] - params[n].grad).abs().max().item()
        DIFFS.append((tag, n, d))
        check(d <= ATOL, f"{tag}: gradient of {n} differs by {d}")
    return info, t


def probe_checks(tmp):
    # At initialisation, full context: names, tying, FLOPs, logits and gradients; nanoGPT's
    # initialisation statistics.
    info, t = compare(tmp, "full", 5, "train", batch=2, time=32, vocab=50, context=32, layers=3,
                      heads=4, width=64)
    if t is not None:
        proj_std = 0.02 / math.sqrt(2 * 3)
        for n, v in t.items():
            if not n.startswith("param/"):
                continue
            if n.endswith("c_proj.weight"):
                want = proj_std
            elif n.endswith(("wte.weight", "wpe.weight", "lm_head.weight", "c_attn.weight",
                             "c_fc.weight")):
                want = 0.02
            elif n.endswith("bias"):
                check(bool((v == 0).all()), f"init: {n} is not zero")
                continue
            else:  # LayerNorm weights
                check(bool((v == 1).all()), f"init: {n} is not one")
                continue
            std, mean = v.std().item(), v.mean().item()
            check(abs(std - want) <= 0.1 * want and abs(mean) <= 0.2 * want,
                  f"init: {n} has mean {mean}, std {std}, expected 0 and {want}")
        # The seed decides the weights: the same seed again gives the same ones, another seed
        # others.
        tokens = torch.zeros(1, 4, dtype=torch.long)
        opts = dict(vocab_size=50, context=32, layers=3, heads=4, width=64)
        _, same = probe(tmp, "same_seed", 5, "eval", tokens, tokens, **opts)
        _, other = probe(tmp, "other_seed", 6, "eval", tokens, tokens, **opts)
        initial = {n: v for n, v in t.items() if n.startswith("param/")}
        check(isinstance(same, dict) and all(torch.equal(same[n], v) for n, v in initial.items()),
              "the same seed gives the same initial weights")
        check(isinstance(other, dict) and not any(torch.equal(other[n], v)
                                                  for n, v in initial.items() if v.dim() == 2),
              "another seed gives other initial weights")
    # Perturbed weights (std 0.3: pre-activations of order 1, LayerNorm weights away from 1,
    # nonzero biases): with biases; bias = false (no Linear or LayerNorm biases) on a sequence
    # shorter than the context.
    compare(tmp, "perturbed", 9, "train", batch=3, time=16, vocab=29, context=16, layers=2,
            heads=4, width=32, perturb=0.3)
    compare(tmp, "no_bias", 7, "train", batch=3, time=5, vocab=13, context=8, layers=2, heads=2,
            width=16, bias=False, perturb=0.3)
    # The reference attention, Linear layers and GELU (LibTorch's operators, as the reference
    # model) on the perturbed case; the fused attention on 3 threads with 1 x 5 (batch, head)
    # pairs, on 1 thread, and with head width 1; the split Linear layers without biases on 3
    # threads, 7 x 14 = 98 rows in three blocks of at least 32 rows (rows 0-31, 32-64, 65-97),
    # where the fused GELU's 98 x 192 = 18,816 values make two chunks (16,384 and 2,432).
    compare(tmp, "perturbed_reference", 9, "train", batch=3, time=16, vocab=29, context=16,
            layers=2, heads=4, width=32, perturb=0.3, attention="reference", fused=False,
            linear="reference", split=False, gelu="reference")
    compare(tmp, "split_three_threads", 3, "train", batch=7, time=14, vocab=19, context=14,
            layers=2, heads=2, width=48, bias=False, perturb=0.3, threads=3)
    compare(tmp, "three_threads", 4, "train", batch=1, time=11, vocab=17, context=12, layers=2,
            heads=5, width=40, perturb=0.3, threads=3)
    compare(tmp, "one_thread", 4, "train", batch=2, time=11, vocab=17, context=12, layers=2,
            heads=3, width=24, perturb=0.3, threads=1)
    compare(tmp, "head_width_1", 6, "train", batch=2, time=6, vocab=11, context=6, layers=1,
            heads=4, width=4, perturb=0.3)
    # The thread count does not change the plugin's results: its blocks depend on the shapes
    # alone (split_linear.cpp, parallel.hpp). 4 x 80 = 320 rows in 8 blocks of 40, 8 (batch,
    # head) pairs and 2 GELU chunks (16,384 and 4,096 values), taken as the threads ask; on 1, 2
    # and 3 threads the logits and every gradient are equal (torch.equal), but for the
    # LayerNorm weights' and biases': ATen's layer_norm backward sums those over rows in one
    # part per thread, and they differed by up to 8.9e-8 between thread counts. (Before the
    # blocks were shape-only, the logits differed by 2.4e-6.) Each run is also compared with the
    # reference.
    runs = [compare(tmp, f"threads_{n}", 11, "train", batch=4, time=80, vocab=23, context=80,
                    layers=1, heads=2, width=16, perturb=0.3, threads=n)[1] for n in (1, 2, 3)]
    if all(r is not None for r in runs):
        for name, v in runs[0].items():
            if name.startswith("grad/") and ".ln_" in name:  # ln_1, ln_2, ln_f
                continue
            check(all(torch.equal(v, r[name]) for r in runs[1:]),
                  f"threads: {name} differs between 1, 2 and 3 threads")
    # Dropout: in evaluation mode the model is the reference; in training mode it drops.
    _, ev = compare(tmp, "dropout_eval", 8, "eval", batch=2, time=8, vocab=13, context=8,
                    layers=2, heads=2, width=16, dropout=0.3, perturb=0.3)
    g = torch.Generator().manual_seed(8)
    tokens = torch.randint(13, (2, 8), generator=g)
    info, tr = probe(tmp, "dropout_train", 8, "train", tokens, tokens, 0.3, vocab_size=13,
                     context=8, layers=2, heads=2, width=16, dropout=0.3)
    check(isinstance(tr, dict) and ev is not None and
          (tr["logits"] - ev["logits"]).abs().max().item() > 1e-3,
          "dropout = 0.3 changes the logits in training mode")
    # Dropping attention weights is the reference attention's: training mode with dropout takes
    # it (evaluation mode, above, takes the fused one).
    check(info is not None and info["graph"] == {"CausalAttention": 0, "SoftmaxBackward": 2,
                                                 "AddmmBackward": 0, "SplitLinear": 9,
                                                 "FusedGelu": 2, "GeluBackward": 0},
          f"dropout in training mode runs the reference attention: {info and info['graph']}")
    # Errors: one message naming the expected and the actual shapes, or width and heads.
    _, err = probe(tmp, "bad_heads", 0, "eval", tokens, tokens, vocab_size=13, context=8,
                   layers=2, heads=3, width=16)
    check(isinstance(err, str) and "gpt: width (16) is not divisible by heads (3)" in err,
          f"width not divisible by heads: {err}")
    long = torch.zeros(2, 9, dtype=torch.long)
    _, err = probe(tmp, "too_long", 0, "eval", long, long, vocab_size=13, context=8, layers=2,
                   heads=2, width=16)
    check(isinstance(err, str) and "gpt: expected int64 token ids of shape [batch, time] with "
          "1 <= time <= context (8), got Long [2, 9]" in err, f"too long: {err}")


VOCAB_TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good "
              "fortune, must be in want of a wife. ") * 40
CTX, BATCH, LAYERS, HEADS, WIDTH, LR, STEPS = 16, 4, 2, 2, 32, 0.5, 3

# The gpt_probe cases run in one `gpt_probe --batch` process, driven from a thread of their own
# beside the keel runs below (two processes at a time, for 2 cores).
PROBES = Batch(PROBE)
probe_tmp = tempfile.TemporaryDirectory()


def run_probe_checks():
    try:
        probe_checks(probe_tmp.name)
    except Exception as e:  # reported as a failure, not lost with the thread
        check(False, f"gpt_probe checks: {type(e).__name__}: {e}")
    cases, status = PROBES.cases, PROBES.close()
    check(status == 0, f"gpt_probe --batch exited with status {status}")
    print(f"{cases} cases in one gpt_probe process")


probes = threading.Thread(target=run_probe_checks)
probes.start()

with tempfile.TemporaryDirectory() as tmp:

    text = os.path.join(tmp, "corpus.txt")
    open(text, "w").write(VOCAB_TEXT)
    r = keel("prepare", text, "--output", os.path.join(tmp, "data"))
    check(r.returncode == 0, f"keel prepare: {r.stderr}")
    vocab = json.load(open(os.path.join(tmp, "data", "vocab.json")))
    tokens = np.fromfile(os.path.join(tmp, "data", "tokens.bin"), dtype="<u2").astype(np.int64)
    V = vocab["size"]

    def manifest(run, extra="", model_extra="", data_extra="", loss="type = \"token_cross_entropy\""):
        path = os.path.join(tmp, run + ".toml")
        open(path, "w").write(f"""
[run]
name = "{run}"
seed = 3
output_dir = "{os.path.join(tmp, run)}"
[train]
max_steps = {STEPS}
log_every = 1
{extra}
[model]
type = "gpt"
vocab_size = {V}
context = {CTX}
layers = {LAYERS}
heads = {HEADS}
width = {WIDTH}
{model_extra}
[data.train]
type = "tokens"
path = "{os.path.join(tmp, 'data', 'tokens.bin')}"
context = {CTX}
batch_size = {BATCH}
sampling = "sequential"
{data_extra}
[optimizer]
type = "sgd"
lr = {LR}
[loss]
{loss}
[checkpoint]
type = "safetensors"
initial = true
[mfu]
type = "peak_flops"
peak_tflops = 1000
[[hooks]]
type = "jsonl"
""")
        return path

    r = keel("train", manifest("golden"))
    check(r.returncode == 0, f"keel train: {r.stderr[-2000:]}")
    run = os.path.join(tmp, "golden")
    check("parameter 'lm_head.weight' is 'transformer.wte.weight' (shared)" in open(os.path.join(run, "run.log")).read(),
          "the run log names the shared parameter")
    start = read_safetensors(os.path.join(run, "checkpoints", "step-0", "model.safetensors"))
    end = read_safetensors(os.path.join(run, "checkpoints", f"step-{STEPS}", "model.safetensors"))
    check("transformer.wte.weight" in start and "lm_head.weight" not in start,
          f"the checkpoint holds the tied weight once: {sorted(start)[:4]}...")
    records = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    train = [x for x in records if x.get("split") == "train"]

    model = GPT(V, CTX, LAYERS, HEADS, WIDTH, bias=True)
    missing = model.load_state_dict(start, strict=False)
    check(missing.missing_keys == ["lm_head.weight"] and not missing.unexpected_keys,
          f"reference loads the checkpoint: {missing}")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    n_params = sum(p.numel() for p in model.parameters())  # the tied weight once
    check(n_params == sum(t.numel() for t in start.values()), "same parameter count")
    # The same run with chunked_cross_entropy (chunks of 24 of the 64 tokens), which takes the
    # gpt's features and output weight (forward_features, compute_linear) in training steps.
    r = keel("train", manifest("linear", loss="type = \"chunked_cross_entropy\"\nchunk_tokens = 24"))
    check(r.returncode == 0, f"keel train with chunked_cross_entropy: {r.stderr[-2000:]}")
    linear_log = open(os.path.join(tmp, "linear", "run.log")).read()
    check("[loss] loss 'chunked_cross_entropy' (plugin keel-losses) applies the output layer "
          "of [model] model 'gpt' (plugin keel-gpt) itself in training steps (forward_features, "
          "compute_linear)" in linear_log, "the run log says the loss applies the output layer")
    check("forward_features" not in open(os.path.join(run, "run.log")).read(),
          "token_cross_entropy runs do not use forward_features")
    linear_train = [x for x in (json.loads(l) for l in open(os.path.join(tmp, "linear", "metrics.jsonl")))
                    if x.get("split") == "train"]
    linear_end = read_safetensors(os.path.join(tmp, "linear", "checkpoints", f"step-{STEPS}",
                                               "model.safetensors"))
    for step in range(STEPS):
        rows = [tokens[(step * BATCH + i) * CTX:(step * BATCH + i) * CTX + CTX + 1] for i in range(BATCH)]
        x = torch.tensor(np.stack([w[:-1] for w in rows]))
        y = torch.tensor(np.stack([w[1:] for w in rows]))
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, V), y.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        for what, records in (("", train), ("chunked_cross_entropy: ", linear_train)):
            got = records[step]["loss_last"] if step < len(records) else float("nan")
            check(abs(got - loss.item()) <= 1e-5 * abs(loss.item()),
                  f"{what}step {step + 1}: keel loss {got} vs reference {loss.item()}")
    ref = model.state_dict()
    for what, final in (("", end), ("chunked_cross_entropy: ", linear_end)):
        for name, t in final.items():
            d = (t - ref[name]).abs().max().item()
            check(d <= 1e-5, f"{what}final {name}: max difference {d}")

    # flops_per_sample = T * (6N + 12 L width T), N without wpe: mfu * peak = flops * samples/s.
    n = n_params - CTX * WIDTH
    flops = CTX * (6 * n + 12 * LAYERS * WIDTH * CTX)
    for rec in train:
        want = flops * rec["samples_per_s"] / 1e15
        check(abs(rec["mfu"] - want) <= 1e-6 * want, f"mfu {rec['mfu']} vs {want}")

    # max_tokens plans the run: 10 steps of 4 x 16 tokens = 640 tokens.
    r = keel("train", manifest("planned", extra="max_tokens = 640"), "--set", "train.max_steps=0",
             "--set", "checkpoint.initial=false", "--set", "hooks=[{type=\"console\"}]")
    check(r.returncode == 0, f"max_tokens run: {r.stderr[-1500:]}")
    out = r.stdout + r.stderr
    check(re.search(r"step 10/10 ", out) is not None and "step 11" not in out,
          f"max_tokens = 640 plans 10 steps: {out[-800:]}")

    # Bad configurations: one line naming the plugin.
    r = keel("train", manifest("bad_heads"), "--set", "model.heads=3")
    check(r.returncode != 0 and "width (32) is not divisible by heads (3)" in r.stderr and
          "keel-gpt" in r.stderr, f"heads: {r.stderr[-600:]}")
    r = keel("train", manifest("too_long"), "--set", "data.train.context=32")
    check(r.returncode != 0 and "gpt: expected int64 token ids of shape [batch, time] with 1 <= time <= context (16), got Long [4, 32]" in r.stderr and
          "keel-gpt" in r.stderr, f"too long: {r.stderr[-600:]}")

    # configs/char_gpt.toml as shipped (on a fresh prepare of the fortunes corpus, 12 steps):
    # it trains, evaluates with bits_per_token = loss / ln 2, and its transformer MFU counts the
    # gpt's parameters but wpe (N = 807808 for vocab 113, width 128, 4 layers, context 128).
    # Its peak is given, 10 TFLOP/s, more than 2 cores reach (2 AVX-512 cores of an AMD EPYC
    # passed 0.1), so that the MFU stays below 1 and the run needs no calibration.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    data = os.path.join(tmp, "fortunes")
    r = subprocess.run([os.path.join(root, "configs", "prepare_fortunes.sh"), KEEL, data],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"prepare_fortunes.sh: {r.stderr}")
    path = os.path.join(data, "tokens.bin")
    r = keel("train", os.path.join(root, "configs", "char_gpt.toml"), "--set", "train.max_tokens=0",
             "--set", "train.max_steps=12", "--set", "train.log_every=6",
             "--set", "train.eval_every_steps=12", "--set", f"data.train.path=\"{path}\"",
             "--set", f"data.test.path=\"{path}\"", "--set", "data.test.samples_per_epoch=64",
             "--set", "mfu.peak_tflops=10",
             "--set", f"run.output_dir=\"{os.path.join(tmp, 'char_gpt')}\"")
    check(r.returncode == 0, f"char_gpt.toml: {r.stderr[-1500:]}")
    # The console: the tied weight's line in run.log only (the golden run above reads it there),
    # and no long line.
    check("(shared)" not in r.stdout, "the shared-weight line stays off the console")
    long_lines = [x for x in r.stdout.splitlines() if len(x) > 160]
    check(not long_lines, f"console lines longer than 160 characters: {long_lines}")
    records = [json.loads(l) for l in open(os.path.join(tmp, "char_gpt", "metrics.jsonl"))]
    evals = [x for x in records if x.get("split") == "test"]
    check(len(evals) == 1 and abs(evals[0]["bits_per_token"] - evals[0]["loss"] / math.log(2)) < 1e-9,
          f"char_gpt evaluation: {evals}")
    check("N = 807808 parameters (16384 excluded)" in open(os.path.join(tmp, "char_gpt", "run.log")).read(),
          "the transformer MFU's N")

probes.join()
probe_tmp.cleanup()
if DIFFS:
    print("largest logits/gradient difference from the reference:", max(d for _, _, d in DIFFS))
print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
