"""Peak memory and step time of [distributed] shard = "none", "optimizer" (ZeRO-1),
"gradients" (ZeRO-2) and "parameters" (FSDP-style) on 2 ranks (issue 23).

The model: gpt, width 512, 16 layers, 8 heads, vocab 8192, context 128 (tied embeddings; its
exact parameter count P is read from the safetensors checkpoint of a 1-step, 1-process probe
run: the sum of the tensors' elements, the tied weight saved once). AdamW (lr 1e-4, weight
decay 0.01), token cross entropy, synthetic tokens (uniform over the vocabulary, a seeded
generator; tokens.bin + vocab.json as tests/cli/test_sharding.py writes them), per-rank batch
B windows of 128 tokens, N steps, log_every 1, no evaluation, no checkpoint, one intra-op
thread per process (`[run] threads = 1`, OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1).

Each configuration runs `keel train` on 2 ranks under `torchrun --no_python --redirects 1
--tee 1 --nproc_per_node=2`; every rank's `done: ... peak RSS X MiB` line (getrusage's
ru_maxrss, the process's peak resident memory) gives its peak, rank 0's metrics.jsonl the step
times (`step_time_ms` of each 1-step record: the slowest rank's); the median over steps 2..N
(step 1 pays first-touch allocations).

Baseline: the same manifest with a gpt of width 16, 1 layer, 2 heads, the same vocabulary
(about 0.14 M parameters) and shard = "none": the process with LibTorch, Gloo, the data and
keel's runtime but (nearly) no model. "B/param" = (peak RSS - the baseline's peak RSS of the
same rank) / P: what the model, its gradients, the optimizer state, activations and every
temporary cost per parameter. The arithmetic for fp32 AdamW at W = 2 ranks, without
activations and buffers: none 4 + 4 + 8 = 16, optimizer 4 + 4 + 8/W = 12, gradients
4 + 4/W + 8/W = 10, parameters 16/W = 8 bytes per parameter (plus, for parameters, the units
gathered at a time and the root: the embeddings, which the gpt keeps gathered for the step).

`[run] malloc_tuning` (default on) raises glibc's mmap threshold to 32 MiB and its trim
threshold to 1 GiB, so freed blocks below 32 MiB stay in the heap; every configuration runs
with malloc_tuning = true and = false (the baseline too), so the table shows both.

R rounds (default 2) run every configuration once, the order reversed every other round; the
table gives per configuration and rank the min and median over rounds of the peak RSS, and the
step time ratio against "none" with the same malloc setting (median of per-round ratios).

Usage: bench_shard.py KEEL_BINARY [--rounds R] [--steps N] [--batch B]
       (defaults R = 2, N = 6, B = 2)
Run it on an otherwise idle machine with 3 GB of free memory: the header prints the load
average and the available memory before the run.
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile

import numpy as np

WORLD = 2
TIMEOUT_S = 900
# torchrun of the Python running this script (its torch: Debian's python3-torch under
# /usr/bin/python3, the wheel's under its venv), not whichever `torchrun` the PATH finds first.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--no_python", "--redirects", "1",
            "--tee", "1"]
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_", "SLURM_", "OMPI_")
VOCAB, CTX, WINDOWS = 8192, 128, 400
BIG = dict(width=512, layers=16, heads=8)
TINY = dict(width=16, layers=1, heads=2)
MODES = ["none", "optimizer", "gradients", "parameters"]
EXPECTED = {"none": 16.0, "optimizer": 4 + 4 + 8 / WORLD, "gradients": 4 + 4 / WORLD + 8 / WORLD,
            "parameters": 16 / WORLD}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCH_VARS)}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return env


def write_tokens(d):
    tokens = np.random.default_rng(23).integers(0, VOCAB, size=WINDOWS * CTX + 1)
    path = os.path.join(d, "tokens.bin")
    tokens.astype("<u2").tofile(path)
    with open(os.path.join(d, "vocab.json"), "w") as f:
        json.dump({"format": "keel-tokens", "version": 1, "dtype": "uint16", "size": VOCAB,
                   "tokens": len(tokens)}, f)
    return path


def manifest(d, tag, data, model, shard, malloc, steps, batch, checkpoint=False):
    path = os.path.join(d, f"{tag}.toml")
    with open(path, "w") as f:
        f.write(f"""hooks = [{{ type = "jsonl" }}]
[run]
name = "bench-shard-{tag}"
output_dir = "{d}/{tag}"
seed = 0
threads = 1
mode = "train"
malloc_tuning = {str(malloc).lower()}
[train]
epochs = 0
max_steps = {steps}
log_every = 1
eval_each_epoch = false
[distributed]
shard = "{shard}"
[model]
type = "gpt"
vocab_size = {VOCAB}
context = {CTX}
layers = {model['layers']}
heads = {model['heads']}
width = {model['width']}
[data.train]
type = "tokens"
path = "{data}"
context = {CTX}
batch_size = {batch}
[optimizer]
type = "adamw"
lr = 1e-4
weight_decay = 0.01
[loss]
type = "token_cross_entropy"
""" + ('[checkpoint]\ntype = "safetensors"\n' if checkpoint else ""))
    return path


def run(cmd, what):
    r = subprocess.run(cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=TIMEOUT_S)
    if r.returncode != 0:
        tail = "\n".join(r.stdout.splitlines()[-40:])
        print(f"bench_shard: {what} failed (exit status {r.returncode}): {' '.join(cmd)}\n"
              f"--- last lines of its output ---\n{tail}", file=sys.stderr)
        sys.exit(1)
    return r.stdout


def parameter_count(keel, d, data):
    """P: the elements of the probe run's model.safetensors (the tied weight saved once)."""
    m = manifest(d, "probe", data, BIG, "none", True, 1, 1, checkpoint=True)
    run([keel, "train", m], "the probe run")
    path = os.path.join(d, "probe", "checkpoints", "step-1", "model.safetensors")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return sum(int(np.prod(v["shape"])) for k, v in header.items() if k != "__metadata__")


def trained(keel, d, data, tag, model, shard, malloc, args):
    """(peak RSS MiB per rank, median step ms over steps 2..N) of one 2-rank run."""
    m = manifest(d, tag, data, model, shard, malloc, args.steps, args.batch)
    out = run(TORCHRUN + [f"--nproc_per_node={WORLD}", "--master_addr=127.0.0.1",
                          f"--master_port={free_port()}", f"--log_dir={d}/torchrun-{tag}",
                          keel, "train", m], tag)
    rss = {}
    for rank, mib in re.findall(r"\[rank (\d+)\] .*done: .*peak RSS ([\d.]+) MiB", out):
        rss[int(rank)] = float(mib)
    if sorted(rss) != list(range(WORLD)):
        sys.exit(f"bench_shard: {tag}: no 'peak RSS' line from every rank (got ranks "
                 f"{sorted(rss)}); a keel from before that line?\n{out[-3000:]}")
    with open(os.path.join(d, tag, "metrics.jsonl")) as f:
        records = [r for r in map(json.loads, f) if r.get("split") == "train"]
    times = [r["step_time_ms"] for r in records if r["step"] > 1]
    if len(times) != args.steps - 1:
        sys.exit(f"bench_shard: {tag}: {len(times)} step records after step 1, expected "
                 f"{args.steps - 1}")
    return [rss[r] for r in range(WORLD)], statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("keel")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=2, help="windows of 128 tokens per rank")
    args = ap.parse_args()
    if args.steps < 2 or args.rounds < 1:
        ap.error("--steps must be >= 2 and --rounds >= 1")
    keel = os.path.abspath(args.keel)
    with open("/proc/meminfo") as f:
        avail = int(re.search(r"MemAvailable:\s+(\d+) kB", f.read()).group(1)) / 1048576
    configs = [(shard, malloc) for malloc in (True, False) for shard in ["baseline"] + MODES]
    with tempfile.TemporaryDirectory(prefix="keel-bench-shard-") as d:
        data = write_tokens(d)
        params = parameter_count(keel, d, data)
        print(f"bench_shard: gpt width {BIG['width']}, {BIG['layers']} layers, {BIG['heads']} "
              f"heads, vocab {VOCAB}, context {CTX}: P = {params:,} parameters; AdamW; "
              f"{WORLD} ranks x 1 thread, batch {args.batch} x {CTX} tokens per rank, "
              f"{args.steps} steps (step time: median of steps 2..{args.steps}); "
              f"{args.rounds} round(s); load average {os.getloadavg()[0]:.2f} on "
              f"{os.cpu_count()} cores, {avail:.1f} GiB available", flush=True)
        rss = {c: [] for c in configs}  # per round: [rank 0 MiB, rank 1 MiB]
        ms = {c: [] for c in configs}
        for r in range(args.rounds):
            order = configs if r % 2 == 0 else configs[::-1]
            for shard, malloc in order:
                tag = f"r{r}-{shard}-{'tuned' if malloc else 'plain'}"
                model = TINY if shard == "baseline" else BIG
                peaks, step_ms = trained(keel, d, data, tag, model,
                                         "none" if shard == "baseline" else shard, malloc, args)
                rss[(shard, malloc)].append(peaks)
                ms[(shard, malloc)].append(step_ms)
                print(f"round {r + 1} {shard:9s} malloc_tuning={str(malloc).lower():5s} "
                      f"peak RSS {' / '.join(f'{p:.1f}' for p in peaks)} MiB  "
                      f"step {step_ms:.0f} ms", flush=True)
    print(f"\nP = {params:,}; B/param = (peak RSS - baseline's peak RSS, same rank and malloc "
          f"setting) / P, median over rounds (min in brackets); expected: fp32 AdamW "
          f"arithmetic at W = {WORLD}")
    print(f"{'mode':10s} {'malloc_tuning':13s} {'peak RSS rank 0 / 1 MiB (median)':34s} "
          f"{'B/param rank 0':18s} {'B/param rank 1':18s} {'expected':8s} step ms  vs none")
    for shard, malloc in configs:
        per_rank = [[round_[k] for round_ in rss[(shard, malloc)]] for k in range(WORLD)]
        med = [statistics.median(x) for x in per_rank]
        line = (f"{shard:10s} {str(malloc).lower():13s} "
                f"{' / '.join(f'{m:.1f}' for m in med):34s} ")
        if shard == "baseline":
            line += f"{'':18s} {'':18s} {'':8s} {statistics.median(ms[(shard, malloc)]):7.0f}"
            print(line)
            continue
        base = [[round_[k] for round_ in rss[("baseline", malloc)]] for k in range(WORLD)]
        for k in range(WORLD):
            above = [(a - b) * 1048576 / params for a, b in zip(per_rank[k], base[k])]
            line += f"{statistics.median(above):6.2f} [{min(above):5.2f}]    "
        ratios = [a / b for a, b in zip(ms[(shard, malloc)], ms[("none", malloc)])]
        line += (f"{EXPECTED[shard]:6.0f}   {statistics.median(ms[(shard, malloc)]):7.0f}  "
                 f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
        print(line)


if __name__ == "__main__":
    main()
