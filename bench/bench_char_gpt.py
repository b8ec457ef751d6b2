"""char-GPT tokens/s through keel against the same training in a plain Python PyTorch loop.

Both sides train configs/char_gpt.toml's model (the `gpt` plugin: a decoder-only transformer as
nanoGPT's, with tied embeddings) on the prepared fortunes tokens (configs/prepare_fortunes.sh)
with the same batch, context, AdamW, gradient-norm clipping and per-token cross entropy, on the
same LibTorch build (python3-torch 1.13.1 and Debian's libtorch, or the pip wheel's torch and
keel's build-wheel: run the script with the Python whose torch keel was built against) with the
same thread settings (bench/keel_threads.py: LibTorch intra-op threads on every core; OpenBLAS's
OpenMP build on the same threads, its pthread build on one; the wheel's MKL on LibTorch's).
With --compile (PyTorch 2.x) a fourth side trains the Python loop's model under torch.compile. Neither evaluates nor
saves checkpoints while timed.

Each round trains three times: keel as configured (the gpt plugin's defaults: fused attention,
split Linear layers, fused GELU), keel with `model.attention`, `model.linear` and `model.gelu`
set to "reference" (nanoGPT's LibTorch operators, the ones the Python loop below calls: what keel's runtime adds or
saves with the model's work held equal), and the Python loop; the order rotates from round to round. keel's tokens/s is the `tokens_per_s` of its
last log window (metrics.jsonl), so start-up and the first window (warm-up) are excluded; the
Python loop is timed over the same window of steps. keel's MFU (the `transformer` calculator)
is reported too, against one float32 matmul peak for every round: before the rounds, a 1-step
keel run with an empty cache directory measures it (the mfu plugin's calibration, docs/mfu.md),
and every round's keel run reads it from that cache. The plugin caches no measurement taken
under load, so the script tries up to 3 times, 10 s apart, and stops when none was cached. (A
peak measured at each run's start, as earlier versions did, made one round's MFU 1.44: its
peak was measured while the machine was busy, half the others.) --cached-peak: the peak cached
in $XDG_CACHE_HOME/keel as a user's runs have it. The 2-core VM's speed drifts (its cached
calibration said 0.2074 TFLOP/s; about 20 hours later 15 runs measured 0.1729 to 0.1965), so
rounds far from the measurement run on a somewhat different machine (bench/README.md).

Usage: bench_char_gpt.py KEEL_BINARY SOURCE_ROOT [--rounds R] [--steps S] [--window W]
           [--cached-peak] [--set KEY=VALUE]...
Defaults: 15 rounds of 30 steps, the last 20 timed (about 15 minutes on the 2-core machine).
On the 2-core VM the three runs of a round drift apart by up to 15% (9 rounds of 45 steps gave
keel-reference/python ratios from 0.86 to 1.06); with 15 rounds the 95% interval is
[x(4), x(12)], so three outlying rounds on either side do not widen it.
Prints one line per round, then for keel/python and keel-reference/python the median of the
per-round ratios of tokens/s (> 1: keel faster) with its 95% sign-test interval and a verdict
(bench/paired.py: keel ahead, behind, or not told apart; for keel-reference/python whether the
target, a median of at least 1.10 with the interval above 1.0, is met; and whether the interval
is too wide to judge a 5% difference), and keel's min and median MFU against the target 0.60
(against the one peak; a round whose MFU was above 1, which keel leaves out of its records,
counts as missing and is named).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import keel_threads  # noqa: E402  (bench/keel_threads.py)
import paired  # noqa: E402  (bench/paired.py)



class Block(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)))

    def attn(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, context, layers, heads, width):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads, context) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(t, dtype=torch.long))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def python_loop(cfg, tokens, compiled=False):
    """The Python side, set up: returns step(), which trains one step (a batch of random windows,
    forward, cross entropy, backward, clipping, AdamW, loss.item()). compiled: the model wrapped
    in torch.compile (PyTorch 2.x; inductor's C++ kernels on the CPU, compiled at the first
    step; the optimizer and clipping stay eager)."""
    torch.manual_seed(cfg["seed"])
    keel_threads.apply()
    m = cfg["model"]
    model = GPT(m["vocab_size"], m["context"], m["layers"], m["heads"], m["width"])
    model.train()
    if compiled:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    rng = np.random.default_rng(cfg["seed"])
    ctx, batch = m["context"], cfg["batch_size"]
    n = len(tokens) - ctx - 1

    def step():
        offs = rng.integers(0, n, size=batch)
        x = torch.from_numpy(np.stack([tokens[o:o + ctx] for o in offs]).astype(np.int64))
        y = torch.from_numpy(np.stack([tokens[o + 1:o + 1 + ctx] for o in offs]).astype(np.int64))
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["max_norm"])
        opt.step()
        loss.item()
    return step


def python_run(cfg, tokens, steps, window, step=None):
    """The Python loop's tokens/s over the last `window` of `steps` steps; `step` an existing
    loop's step function (the compiled one, set up and compiled once) instead of a fresh loop."""
    step = step or python_loop(cfg, tokens)
    t0 = None
    for i in range(steps):
        if i == steps - window:
            t0 = time.perf_counter()
        step()
    secs = time.perf_counter() - t0
    return window * cfg["batch_size"] * cfg["model"]["context"] / secs


def keel_run(keel, manifest, out, steps, window, sets, peak_cache=None):
    """keel's last-window tokens/s, MFU and the peak it used (TFLOP/s); with `peak_cache`, an
    empty directory as XDG_CACHE_HOME, so that keel measures the peak at this run's start."""
    args = [keel, "train", manifest, "--set", "train.max_tokens=0",
            "--set", f"train.max_steps={steps}", "--set", f"train.log_every={window}",
            "--set", "train.eval_every_steps=0", "--set", "run.mode=\"train\"",
            "--set", f"run.output_dir=\"{out}\"", "--set", "hooks=[{type=\"jsonl\"}]"]
    for s in sets:
        args += ["--set", s]
    env = dict(os.environ, XDG_CACHE_HOME=peak_cache) if peak_cache else None
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    last = [r for r in records if r.get("split") == "train"][-1]
    return last["tokens_per_s"], last.get("mfu"), last.get("mfu_peak_tflops")


def measure_peak(keel, manifest, tmp, sets, tries=3):
    """One peak for every round: a 1-step keel run with an empty cache directory, repeated until
    the mfu plugin caches its measurement (it caches none taken under load). Returns the cache
    directory and the peak (TFLOP/s); exits when no try was cached."""
    cache = os.path.join(tmp, "peak-cache")
    for t in range(tries):
        _, _, peak = keel_run(keel, manifest, os.path.join(tmp, f"peak{t}"), 1, 1, sets, cache)
        if os.path.exists(os.path.join(cache, "keel", "peak_flops.json")):
            return cache, peak
        print(f"bench_char_gpt: the peak measured before the rounds ({peak:.4f} TFLOP/s) was "
              f"taken under load (other processes running) and not cached; try {t + 1} of "
              f"{tries}", flush=True)
        time.sleep(10)
    sys.exit("bench_char_gpt: the machine stayed busy: no peak measured without load; run the "
             "benchmark on an idle machine")


def load(manifest):
    """The manifest's settings the Python loop uses, and the train split's tokens."""
    import tomllib
    with open(manifest, "rb") as f:
        t = tomllib.load(f)
    cfg = {"seed": t["run"]["seed"], "model": t["model"], "lr": t["optimizer"]["lr"],
           "weight_decay": t["optimizer"]["weight_decay"],
           "batch_size": t["data"]["train"]["batch_size"],
           "max_norm": t["grad_clipper"]["max_norm"]}
    path = os.path.join(os.path.dirname(manifest), t["data"]["train"]["path"])
    with open(os.path.join(os.path.dirname(path), "vocab.json")) as f:
        vocab = json.load(f)
    tokens = np.memmap(path, dtype=np.dtype(vocab["dtype"]).newbyteorder("<"), mode="r")
    return cfg, tokens[: int(len(tokens) * 0.9)]  # the train split (val_fraction 0.1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("keel")
    ap.add_argument("root")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--cached-peak", action="store_true",
                    help="keel's MFU against the cached peak instead of one measured each run")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--peak", type=float, default=0.0,
                    help="keel's MFU against this float32 peak (TFLOP/s, mfu.peak_tflops) instead "
                    "of one measured before the rounds (for a machine that other work keeps busy, "
                    "where no measurement is cached)")
    ap.add_argument("--compile", action="store_true",
                    help="a fourth side: the Python loop with torch.compile(model) (PyTorch 2.x), "
                    "compiled once before the rounds (the compile time is printed) and trained on "
                    "in every round")
    a = ap.parse_args()
    manifest = os.path.join(a.root, "configs/char_gpt.toml")
    cfg, tokens = load(manifest)
    print(f"bench_char_gpt: {manifest}: {a.steps} steps/run, window of the last {a.window}, "
          f"{a.rounds} rounds, {keel_threads.apply()}, batch {cfg['batch_size']} x "
          f"{cfg['model']['context']} tokens; load average {os.getloadavg()[0]:.2f} before")
    reference = a.set + ['model.attention="reference"', 'model.linear="reference"',
                         'model.gelu="reference"']
    ratios, ref_ratios, mfus, compiled_ratios = [], [], [], []
    compiled_step = None
    if a.compile:
        compiled_step = python_loop(cfg, tokens, compiled=True)
        t0 = time.perf_counter()
        compiled_step()
        compiled_step()  # the second step too: the optimizer's state exists from then on
        print(f"bench_char_gpt: torch.compile: the first 2 steps (compilation) took "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if a.peak:
            a.set.append(f"mfu.peak_tflops={a.peak}")
        peak_cache, peak = ((None, None) if a.cached_peak or a.peak else
                            measure_peak(a.keel, manifest, tmp, a.set))
        if peak_cache:
            print(f"bench_char_gpt: peak {peak:.4f} TFLOP/s, measured once before the rounds "
                  f"without load, for every round's MFU", flush=True)
        for r in range(a.rounds):
            # Three runs a round, in an order that rotates from round to round.
            sides = {
                "keel": lambda: keel_run(a.keel, manifest, os.path.join(tmp, f"k{r}"), a.steps,
                                         a.window, a.set, peak_cache),
                "keel-reference": lambda: keel_run(a.keel, manifest, os.path.join(tmp, f"r{r}"),
                                                   a.steps, a.window, reference),
                "python": lambda: python_run(cfg, tokens, a.steps, a.window),
            }
            if compiled_step:
                sides["python-compiled"] = lambda: python_run(cfg, tokens, a.steps, a.window,
                                                              compiled_step)
            order = list(sides)[r % len(sides):] + list(sides)[:r % len(sides)]
            got = {name: sides[name]() for name in order}
            (k, mfu, used), (kr, _, _), p = got["keel"], got["keel-reference"], got["python"]
            ratios.append(k / p)
            ref_ratios.append(kr / p)
            mfus.append(mfu)
            compiled_text = ""
            if compiled_step:
                c = got["python-compiled"]
                compiled_ratios.append(k / c)
                compiled_text = f"; python-compiled {c:.0f} tokens/s, keel/python-compiled {k / c:.3f}"
            mfu_text = (f"{mfu:.3f}" if mfu is not None else "missing (above 1: keel left it "
                        "out)")
            print(f"  round {r + 1} ({', '.join(order)}): keel {k:.0f}, keel-reference {kr:.0f}, "
                  f"python {p:.0f} tokens/s; keel/python {k / p:.3f}, keel-reference/python "
                  f"{kr / p:.3f}; keel MFU {mfu_text} of {used:.4f} TFLOP/s{compiled_text}", flush=True)
    print("bench_char_gpt: keel/python tokens/s: " + paired.verdict(ratios))
    print("bench_char_gpt: keel-reference/python tokens/s (the same operators as the Python "
          "loop): " + paired.verdict(ref_ratios, target=1.10))
    if compiled_ratios:
        print("bench_char_gpt: keel/python-compiled tokens/s (torch.compile): " +
              paired.verdict(compiled_ratios))
    print(f"bench_char_gpt: load average {os.getloadavg()[0]:.2f} after the rounds")
    known = [m for m in mfus if m is not None]
    missing = [str(i + 1) for i, m in enumerate(mfus) if m is None]
    against = (f"the peak measured before the rounds ({peak:.4f} TFLOP/s)" if peak_cache else
               f"the given peak ({a.peak:.4f} TFLOP/s)" if a.peak else "the cached peak")
    if not known:
        print(f"bench_char_gpt: keel MFU missing in every round (above 1 against {against})")
        return
    mfu = statistics.median(known)
    print(f"bench_char_gpt: keel MFU min {min(known):.3f}  median {mfu:.3f} against {against} "
          f"(target median >= 0.60: {'met' if mfu >= 0.60 else 'not met'})" +
          (f"; missing (above 1) in round(s) {', '.join(missing)}" if missing else ""))

if __name__ == "__main__":
    sys.exit(main())
