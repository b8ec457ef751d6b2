"""The gpt model plugin against a PyTorch reference of the same architecture (python3-torch, the
same LibTorch build), through real `keel train` runs on a tiny character corpus:

- keel trains 3 SGD steps (lr 0.5, no momentum, dropout 0) on sequential windows of the tokens
  dataset from its initial weights, saved as the step-0 checkpoint (safetensors); the reference
  (nanoGPT's model, tied lm_head) loads those weights, trains on the same windows, and every
  step's loss agrees within 1e-5 (relative), and every final parameter within 1e-5 (absolute);
- the tied weight is trained once: the checkpoints hold transformer.wte.weight and no
  lm_head.weight, and the reference (where the two are one Parameter) ends with the same values,
  which a double update of the shared tensor would not give;
- the run log says lm_head.weight is shared; flops_per_sample follows T * (6N + 12*L*width*T)
  through the peak_flops MFU (mfu * peak = flops_per_sample * samples/s);
- train.max_tokens plans the run's length from the dataset's tokens per sample (the progress
  line "step k/N" and the cosine schedule's end);
- a width not divisible by heads, and a window longer than the model's context, fail with one
  line naming the plugin;
- configs/char_gpt.toml trains 12 steps on the fortunes corpus (configs/prepare_fortunes.sh),
  reports bits_per_token = loss / ln 2, and its transformer MFU counts N without wpe.

Usage: test_gpt.py KEEL_BINARY
"""
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

KEEL = sys.argv[1]
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


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(width, 3 * width)
        self.attn.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(width, 4 * width)
        self.mlp.c_proj = nn.Linear(4 * width, width)

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
    def __init__(self, vocab, context, layers, heads, width):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, width)
        self.transformer.wpe = nn.Embedding(context, width)
        self.transformer.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.transformer.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, idx):
        t = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def keel(*args):
    return subprocess.run([KEEL, *args], capture_output=True, text=True)


VOCAB_TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good "
              "fortune, must be in want of a wife. ") * 40
CTX, BATCH, LAYERS, HEADS, WIDTH, LR, STEPS = 16, 4, 2, 2, 32, 0.5, 3

with tempfile.TemporaryDirectory() as tmp:
    text = os.path.join(tmp, "corpus.txt")
    open(text, "w").write(VOCAB_TEXT)
    r = keel("prepare", text, "--output", os.path.join(tmp, "data"))
    check(r.returncode == 0, f"keel prepare: {r.stderr}")
    vocab = json.load(open(os.path.join(tmp, "data", "vocab.json")))
    tokens = np.fromfile(os.path.join(tmp, "data", "tokens.bin"), dtype="<u2").astype(np.int64)
    V = vocab["size"]

    def manifest(run, extra="", model_extra="", data_extra=""):
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
type = "token_cross_entropy"
[checkpoint]
type = "safetensors"
initial = true
[mfu]
type = "peak_flops"
peak_tflops = 0.001
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

    model = GPT(V, CTX, LAYERS, HEADS, WIDTH)
    missing = model.load_state_dict(start, strict=False)
    check(missing.missing_keys == ["lm_head.weight"] and not missing.unexpected_keys,
          f"reference loads the checkpoint: {missing}")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    n_params = sum(p.numel() for p in model.parameters())  # the tied weight once
    check(n_params == sum(t.numel() for t in start.values()), "same parameter count")
    for step in range(STEPS):
        rows = [tokens[(step * BATCH + i) * CTX:(step * BATCH + i) * CTX + CTX + 1] for i in range(BATCH)]
        x = torch.tensor(np.stack([w[:-1] for w in rows]))
        y = torch.tensor(np.stack([w[1:] for w in rows]))
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, V), y.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        got = train[step]["loss_last"]
        check(abs(got - loss.item()) <= 1e-5 * abs(loss.item()),
              f"step {step + 1}: keel loss {got} vs reference {loss.item()}")
    ref = model.state_dict()
    for name, t in end.items():
        d = (t - ref[name]).abs().max().item()
        check(d <= 1e-5, f"final {name}: max difference {d}")

    # flops_per_sample = T * (6N + 12 L width T), N without wpe: mfu * peak = flops * samples/s.
    n = n_params - CTX * WIDTH
    flops = CTX * (6 * n + 12 * LAYERS * WIDTH * CTX)
    for rec in train:
        want = flops * rec["samples_per_s"] / 1e9
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
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data = os.path.join(tmp, "fortunes")
    r = subprocess.run([os.path.join(root, "configs", "prepare_fortunes.sh"), KEEL, data],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"prepare_fortunes.sh: {r.stderr}")
    path = os.path.join(data, "tokens.bin")
    r = keel("train", os.path.join(root, "configs", "char_gpt.toml"), "--set", "train.max_tokens=0",
             "--set", "train.max_steps=12", "--set", "train.log_every=6",
             "--set", "train.eval_every_steps=12", "--set", f"data.train.path=\"{path}\"",
             "--set", f"data.test.path=\"{path}\"", "--set", "data.test.samples_per_epoch=64",
             "--set", "mfu.peak_tflops=0.1",
             "--set", f"run.output_dir=\"{os.path.join(tmp, 'char_gpt')}\"")
    check(r.returncode == 0, f"char_gpt.toml: {r.stderr[-1500:]}")
    records = [json.loads(l) for l in open(os.path.join(tmp, "char_gpt", "metrics.jsonl"))]
    evals = [x for x in records if x.get("split") == "test"]
    check(len(evals) == 1 and abs(evals[0]["bits_per_token"] - evals[0]["loss"] / math.log(2)) < 1e-9,
          f"char_gpt evaluation: {evals}")
    check("N = 807808 parameters (16384 excluded)" in open(os.path.join(tmp, "char_gpt", "run.log")).read(),
          "the transformer MFU's N")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
