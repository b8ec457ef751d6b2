"""Operator profile of char-GPT training steps, keel beside the Python loop of bench_char_gpt.py.

    bench/profile_char_gpt.py KEEL_BINARY SOURCE_ROOT [--attention reference|fused]
                              [--linear reference|split] [--gelu reference|fused]
                              [--warmup W] [--steps S] [--keel-only] [--top N]

keel: `keel train configs/char_gpt.toml` with the `chrome_trace` profiler recording LibTorch's
operators (operators = true, no shapes, no memory) over steps W+1 .. W+S (the run takes one
step more: the profiler records a step's operators when the next step starts), and the model's
attention, Linear layers and GELU as given (default "reference" for all three: nanoGPT's
operators, the Python loop's; keel's defaults are --attention fused --linear split --gelu fused). Python: the
loop of bench_char_gpt.py (same model, data, AdamW, clipping, loss, thread settings) under
torch.autograd.profiler for S steps after W warm-up steps. Both in this one command, one after
the other, so the two columns come from the same minute of the machine.

Prints keel's profiler phases (ms per step), then per operator: calls per step and self time
(the operator's time less the operators it called) per step, keel and Python side by side,
sorted by the larger self time, and the operators whose call counts differ. Self times come
from the trace's nesting on each thread (keel) and from key_averages (Python); the profilers
add their own cost to every call, so compare the two columns, not the totals with an
unprofiled run. With --keel-only, only keel (e.g. with keel's defaults, whose kernels have no
counterpart in the Python loop).
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

import torch

import bench_char_gpt  # noqa: E402  (bench/bench_char_gpt.py: the Python model)


def self_times(events):
    """{name: [calls, self us]} from complete events, nested per thread by time."""
    by_tid = collections.defaultdict(list)
    for e in events:
        by_tid[e["tid"]].append(e)
    agg = collections.defaultdict(lambda: [0, 0.0])
    for evs in by_tid.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack, child = [], collections.defaultdict(float)
        for i, e in enumerate(evs):
            while stack and evs[stack[-1]]["ts"] + evs[stack[-1]]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                child[stack[-1]] += e["dur"]
            stack.append(i)
        for i, e in enumerate(evs):
            a = agg[e["name"]]
            a[0] += 1
            a[1] += e["dur"] - child[i]
    return agg


def keel_side(keel, manifest, kernels, warmup, steps):
    with tempfile.TemporaryDirectory(prefix="keel-profile-") as out:
        profiler = (f'{{type="chrome_trace", operators=true, record_shapes=false, '
                    f'profile_memory=false, start_step={warmup + 1}, end_step={warmup + steps}}}')
        args = [keel, "train", manifest, "--set", "train.max_tokens=0",
                "--set", f"train.max_steps={warmup + steps + 1}",
                "--set", "train.log_every=1000000",
                "--set", "train.eval_every_steps=0", "--set", 'run.mode="train"',
                "--set", f'run.output_dir="{out}"', "--set", "hooks=[]",
                "--set", f"profiler={profiler}"]
        for option, value in kernels.items():
            args += ["--set", f'model.{option}="{value}"']
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "trace.json")) as f:
            trace = json.load(f)["traceEvents"]
    phases = collections.defaultdict(float)
    for e in trace:
        if e.get("pid") == 0:
            phases[e["name"]] += e["dur"]
    ops = [e for e in trace if e.get("pid") == 1 and e.get("ph") == "X"]
    return self_times(ops), phases


def python_side(cfg, tokens, warmup, steps):
    step = bench_char_gpt.python_loop(cfg, tokens)
    for _ in range(warmup):
        step()
    with torch.autograd.profiler.profile() as prof:
        for _ in range(steps):
            step()
    return {e.key: [e.count, e.self_cpu_time_total]
            for e in prof.key_averages()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("keel")
    ap.add_argument("root")
    ap.add_argument("--attention", default="reference", choices=["reference", "fused"])
    ap.add_argument("--linear", default="reference", choices=["reference", "split"])
    ap.add_argument("--gelu", default="reference", choices=["reference", "fused"])
    ap.add_argument("--warmup", type=int, default=12)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--keel-only", action="store_true")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    manifest = os.path.join(a.root, "configs/char_gpt.toml")
    cfg, tokens = bench_char_gpt.load(manifest)
    kernels = {"attention": a.attention, "linear": a.linear, "gelu": a.gelu}
    k, phases = keel_side(os.path.abspath(a.keel), manifest, kernels, a.warmup, a.steps)
    p = {} if a.keel_only else python_side(cfg, tokens, a.warmup, a.steps)
    per = lambda us: us / 1000 / a.steps  # noqa: E731  (microseconds in S steps -> ms/step)
    print(f"profile_char_gpt: attention {a.attention}, linear {a.linear}, gelu {a.gelu}, "
          f"steps {a.warmup + 1}..{a.warmup + a.steps}")
    print("keel phases, ms/step: " + ", ".join(f"{n} {per(v):.1f}" for n, v in phases.items()))
    print(f"self time, ms/step: keel {per(sum(v[1] for v in k.values())):.1f}" +
          ("" if a.keel_only else f", python {per(sum(v[1] for v in p.values())):.1f}"))
    names = sorted(set(k) | set(p), key=lambda n: -max(k.get(n, [0, 0])[1], p.get(n, [0, 0])[1]))
    print(f"{'operator':50s} {'keel calls':>10s} {'py calls':>9s} {'keel ms':>8s} {'py ms':>8s}")
    for n in names[:a.top]:
        x, y = k.get(n, [0, 0]), p.get(n, [0, 0])
        print(f"{n[:50]:50s} {x[0] / a.steps:10.1f} {y[0] / a.steps:9.1f} {per(x[1]):8.2f} "
              f"{per(y[1]):8.2f}")
    if not a.keel_only:
        print("operators called a different number of times per step (keel, python):")
        for n in names:
            x, y = k.get(n, [0])[0] / a.steps, p.get(n, [0])[0] / a.steps
            if abs(x - y) >= 0.1:
                print(f"  {n[:60]:60s} {x:8.1f} {y:8.1f}")


if __name__ == "__main__":
    sys.exit(main())
