"""Peak memory and step time of [distributed] shard = "none", "optimizer" (ZeRO-1),
"gradients" (ZeRO-2) and "parameters" (FSDP-style) on 2 ranks (issue 23), and with --fsdp2
PyTorch's FSDP2 on the same model (issue 44). Every "2 ranks" below is W with --ranks W.

The model: gpt, width 512, 16 layers, 8 heads, vocab 8192, context 128 (tied embeddings; its
exact parameter count P is read from the safetensors checkpoint of a 1-step, 1-process probe
run: the sum of the tensors' elements, the tied weight saved once). AdamW (lr 1e-4, weight
decay 0.01), token cross entropy, synthetic tokens (uniform over the vocabulary, a seeded
generator; tokens.bin + vocab.json as tests/cli/test_sharding.py writes them), per-rank batch
B windows of 128 tokens, N steps, log_every 1, no evaluation, no checkpoint, one intra-op
thread per process (`[run] threads = 1`, OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1).

Each configuration runs `keel train` on 2 ranks under `torchrun --no_python --redirects 1
--tee 1 --nproc_per_node=2` (the log lines of a 1-rank keel have no "[rank R]"); every rank's `done: ... peak RSS X MiB` line (getrusage's
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
with malloc_tuning = true and = false (the baseline too), so the table shows both. Every
process starts without the MALLOC_* variables of this script's environment (keel's "false"
rows are glibc's defaults).

--fsdp2 PYTHON adds PyTorch's FSDP2 on the same gpt (issue 44): `PYTHON -m
torch.distributed.run --redirects 1 --tee 1 --nproc_per_node=2` runs this file as a worker
(`--fsdp2-worker`, fsdp2_worker below) on 2 ranks: the Gloo backend on the CPU, a 1-D device
mesh of the 2 ranks; bench_char_gpt.py's GPT (nanoGPT's model, the gpt plugin's architecture,
tied lm_head; a causal-mask buffer, no parameter) built whole on every rank with seed 0 (keel's
"parameters" also creates the whole model on every rank before it shards it; torchtitan builds
on the meta device instead), then
`fully_shard` on each transformer block and on the root (the embeddings, ln_f and the tied
lm_head), as torchtitan wraps its models, with fully_shard's defaults; its parameter count (the
tied weight once) must equal keel's P, else the script stops. torch.optim.AdamW (lr 1e-4,
weight decay 0.01, betas and eps at their defaults, as keel's adamw), torch.set_num_threads(1)
and the same OMP_NUM_THREADS / OPENBLAS_NUM_THREADS; a step is B random windows of 128 tokens
of the same tokens.bin (a generator seeded with the rank), forward, mean token cross entropy,
zero_grad(set_to_none), backward, AdamW's step and loss.item(); no clipping, as keel's runs
have none. Each step is timed on every rank (time.perf_counter) and the slowest rank's time
kept (an all_reduce MAX after the step, outside the timed part); the median over steps 2..N,
as for keel. Peak memory: each rank's getrusage(RUSAGE_SELF).ru_maxrss after the last step.
Its baseline ("fsdp2-base") is the same worker with the baseline's tiny gpt, so that fsdp2's
B/param = (peak RSS - fsdp2-base's peak RSS, same rank and malloc setting) / P counts what the
model costs it as keel's counts, without the Python interpreter and torch's own import. glibc
settings: in the malloc_tuning = true rows the worker's environment holds
MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 (keel's malloc_tuning
thresholds), in the false rows no MALLOC_* variable; the header prints both. PYTHON's torch
must have torch.distributed.fsdp.fully_shard (PyTorch 2.6 on), else the script stops with one
line: Debian's python3-torch 1.13 has none. Only a keel built against the same LibTorch
(build-wheel/ against .venv-torch's torch 2.11) compares like with like; run the script itself
under that same Python, whose torchrun (`-m torch.distributed.run`) launches keel's ranks.

R rounds (default 2) run every configuration once, the order reversed every other round; the
table gives per configuration and rank the median and min over rounds of the peak RSS and of
B/param, the median over rounds of the step time, the step time ratio against keel's "none"
with the same malloc setting (per-round ratios: median, min, max) and, on the fsdp2 rows,
fsdp2 / keel's "parameters" of the same round and malloc setting for the step time and each
rank's peak RSS (per-round ratios: median and min; > 1: FSDP2 slower or larger).

Usage: bench_shard.py KEEL_BINARY [--rounds R] [--steps N] [--batch B] [--fsdp2 PYTHON]
                      [--modes MODE,...] [--small] [--ranks W] [--malloc both|true|false]
                      [--set KEY=VALUE]...
       (defaults R = 2, N = 6, B = 2, every keel mode, no FSDP2, W = 2, both malloc settings)
--ranks W: every run (keel's, FSDP2's, the baselines) on W ranks instead of 2. With W = 1 each
side runs its sharded step with nothing to exchange (the collectives have one rank), which
separates the model's own compute from the communication of the 2-rank runs.
--malloc: only the malloc_tuning = true (or false) configurations.
--set KEY=VALUE (repeatable): passed to keel's training runs (the baseline's too), e.g.
--set 'model.linear="reference"' (the gpt plugin's Linear layers as PyTorch's F.linear).
--modes: the keel shard modes to run (a comma-separated subset of none, optimizer, gradients,
parameters; the baseline always runs; "vs none" needs none, fsdp2/keel needs parameters).
--small: a gpt of width 64, 2 layers, 2 heads instead of the 50 M one, to try the script
quickly (its numbers measure nothing).
Run it on an otherwise idle machine with 3 GB of free memory (4 GB with --fsdp2: its ranks
peaked near 2 GB each in a trial): the header prints the load average and the available memory
before the run.
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
# keel's [run] malloc_tuning = true (kernel: mallopt) as glibc's environment variables.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"}
SMALL = dict(width=64, layers=2, heads=2)


def expected(mode):
    """fp32 AdamW's bytes per parameter at WORLD ranks, without activations and buffers."""
    return {"none": 16.0, "optimizer": 4 + 4 + 8 / WORLD, "gradients": 4 + 4 / WORLD + 8 / WORLD,
            "parameters": 16 / WORLD}[mode]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(malloc_env=False):
    """This process's environment without launcher variables and without glibc's MALLOC_*
    variables; one intra-op thread; with malloc_env, keel's malloc_tuning thresholds (MALLOC_ENV)
    as environment variables (the FSDP2 worker's "true" rows)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(LAUNCH_VARS) and not k.startswith("MALLOC_")}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if malloc_env:
        env.update(MALLOC_ENV)
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


def run(cmd, what, env=None):
    r = subprocess.run(cmd, env=env or clean_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S)
    if r.returncode != 0:
        tail = "\n".join(r.stdout.splitlines()[-40:])
        print(f"bench_shard: {what} failed (exit status {r.returncode}): {' '.join(cmd)}\n"
              f"--- last lines of its output ---\n{tail}", file=sys.stderr)
        sys.exit(1)
    return r.stdout


def parameter_count(keel, d, data, model):
    """P: the elements of the probe run's model.safetensors (the tied weight saved once)."""
    m = manifest(d, "probe", data, model, "none", True, 1, 1, checkpoint=True)
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
                          keel, "train", m] + [a for kv in args.set for a in ("--set", kv)], tag)
    rss = {}
    # keel prefixes its lines with "[rank R]" when there are several ranks.
    for rank, mib in re.findall(r"(?:\[rank (\d+)\] )?done: .*peak RSS ([\d.]+) MiB", out):
        rss[int(rank or 0)] = float(mib)
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


def fsdp2_worker(argv):
    """One rank of the FSDP2 side, under torchrun (run as `bench_shard.py --fsdp2-worker ...`
    by the --fsdp2 Python): bench_char_gpt.py's GPT (the gpt plugin's architecture, tied
    embeddings) built whole on every rank (seed 0, as keel builds it) and then sharded with
    fully_shard per block and on the root; AdamW; writes rank<r>.json into --out: its
    ru_maxrss in MiB at the end, the parameter count and, on rank 0, every step's time (the
    slowest rank's: an all_reduce MAX after the step, outside the timed part)."""
    ap = argparse.ArgumentParser()
    for name in ("out", "data"):
        ap.add_argument("--" + name, required=True)
    for name in ("width", "layers", "heads", "steps", "batch"):
        ap.add_argument("--" + name, type=int, required=True)
    a = ap.parse_args(argv)
    import resource
    import time
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from bench_char_gpt import GPT  # bench/bench_char_gpt.py: nanoGPT's model, tied lm_head

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = GPT(VOCAB, CTX, a.layers, a.heads, a.width)
    params = sum(p.numel() for p in model.parameters())  # the tied weight once
    for block in model.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if model.lm_head.weight is not model.wte.weight:
        sys.exit("bench_shard: fully_shard untied lm_head.weight from wte.weight")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    tokens = np.fromfile(a.data, dtype="<u2").astype(np.int64)
    rng = np.random.default_rng(rank)
    n = len(tokens) - CTX - 1
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        offs = rng.integers(0, n, size=a.batch)
        x = torch.from_numpy(np.stack([tokens[o:o + CTX] for o in offs]))
        y = torch.from_numpy(np.stack([tokens[o + 1:o + 1 + CTX] for o in offs]))
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        dt = torch.tensor([(time.perf_counter() - t0) * 1000.0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        times.append(dt.item())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kB on Linux
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump({"peak_rss_mib": peak, "params": params,
                   "step_ms": times if rank == 0 else []}, f)
    dist.barrier()
    dist.destroy_process_group()


def fsdp2_check(python):
    """Refuses (exits with one line) unless `python`'s torch has fully_shard; its version."""
    r = subprocess.run([python, "-c", "import torch; from torch.distributed.fsdp import "
                        "fully_shard; print(torch.__version__)"], env=clean_env(),
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if r.returncode != 0:
        sys.exit(f"bench_shard: --fsdp2 {python}: its torch has no "
                 f"torch.distributed.fsdp.fully_shard (FSDP2 needs PyTorch 2.6 or later; "
                 f"Debian's python3-torch 1.13 has none)")
    return r.stdout.strip()


def fsdp2_trained(python, d, data, tag, model, malloc, args):
    """(peak RSS MiB per rank, median step ms over steps 2..N, parameter count) of one 2-rank
    FSDP2 run: `python -m torch.distributed.run` running this file's fsdp2_worker, with keel's
    malloc_tuning thresholds as environment variables when `malloc`, with none otherwise."""
    out = os.path.join(d, tag)
    os.makedirs(out)
    run([python, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1",
         f"--nproc_per_node={WORLD}", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
         f"--log_dir={d}/torchrun-{tag}", os.path.abspath(__file__), "--fsdp2-worker",
         "--out", out, "--data", data, "--width", str(model["width"]),
         "--layers", str(model["layers"]), "--heads", str(model["heads"]),
         "--steps", str(args.steps), "--batch", str(args.batch)], tag, env=clean_env(malloc))
    ranks = []
    for r in range(WORLD):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    times = ranks[0]["step_ms"][1:]
    return [x["peak_rss_mib"] for x in ranks], statistics.median(times), ranks[0]["params"]


def main():
    global WORLD
    ap = argparse.ArgumentParser()
    ap.add_argument("keel")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=2, help="windows of 128 tokens per rank")
    ap.add_argument("--fsdp2", metavar="PYTHON",
                    help="also train with FSDP2 (fully_shard, Gloo) under this Python's torch")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated keel shard modes to run (default: all four)")
    ap.add_argument("--small", action="store_true",
                    help=f"a gpt of width {SMALL['width']}, {SMALL['layers']} layers, "
                         f"{SMALL['heads']} heads instead (to try the script, not to measure)")
    ap.add_argument("--ranks", type=int, default=2,
                    help="ranks per run, keel's and FSDP2's alike (default 2; 1: the same "
                         "sharded step with nothing to exchange)")
    ap.add_argument("--malloc", choices=("both", "true", "false"), default="both",
                    help="the malloc_tuning settings to run (default both)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a keel --set for keel's runs (not the probe's, not FSDP2's), e.g. "
                         "model.linear='\"reference\"'")
    args = ap.parse_args()
    WORLD = args.ranks
    modes = args.modes.split(",")
    if args.steps < 2 or args.rounds < 1 or args.ranks < 1:
        ap.error("--steps must be >= 2, --rounds and --ranks >= 1")
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: a comma-separated subset of {','.join(MODES)}")
    big = SMALL if args.small else BIG
    keel = os.path.abspath(args.keel)
    fsdp2_version = fsdp2_check(args.fsdp2) if args.fsdp2 else None
    with open("/proc/meminfo") as f:
        avail = int(re.search(r"MemAvailable:\s+(\d+) kB", f.read()).group(1)) / 1048576
    sides = ["baseline"] + modes + (["fsdp2-base", "fsdp2"] if args.fsdp2 else [])
    settings = {"both": (True, False), "true": (True,), "false": (False,)}[args.malloc]
    configs = [(shard, malloc) for malloc in settings for shard in sides]
    with tempfile.TemporaryDirectory(prefix="keel-bench-shard-") as d:
        data = write_tokens(d)
        params = parameter_count(keel, d, data, big)
        print(f"bench_shard: gpt width {big['width']}, {big['layers']} layers, {big['heads']} "
              f"heads, vocab {VOCAB}, context {CTX}: P = {params:,} parameters; AdamW; "
              f"{WORLD} ranks x 1 thread, batch {args.batch} x {CTX} tokens per rank, "
              f"{args.steps} steps (step time: median of steps 2..{args.steps}); "
              f"{args.rounds} round(s); load average {os.getloadavg()[0]:.2f} on "
              f"{os.cpu_count()} cores, {avail:.1f} GiB available"
              + "".join(f"; keel --set {kv}" for kv in args.set), flush=True)
        if args.fsdp2:
            tuned = " ".join(f"{k}={v}" for k, v in MALLOC_ENV.items())
            print(f"FSDP2: {args.fsdp2} (torch {fsdp2_version}), fully_shard per block and on "
                  f"the root, Gloo, CPU\n"
                  f"FSDP2 environment, malloc_tuning=true rows:  {tuned}\n"
                  f"FSDP2 environment, malloc_tuning=false rows: no MALLOC_* variables",
                  flush=True)
        rss = {c: [] for c in configs}  # per round: [rank 0 MiB, rank 1 MiB]
        ms = {c: [] for c in configs}
        for r in range(args.rounds):
            order = configs if r % 2 == 0 else configs[::-1]
            for shard, malloc in order:
                tag = f"r{r}-{shard}-{'tuned' if malloc else 'plain'}"
                model = TINY if shard in ("baseline", "fsdp2-base") else big
                if shard.startswith("fsdp2"):
                    peaks, step_ms, n = fsdp2_trained(args.fsdp2, d, data, tag, model, malloc,
                                                      args)
                    if shard == "fsdp2" and n != params:
                        sys.exit(f"bench_shard: the FSDP2 model has {n:,} parameters, keel's "
                                 f"gpt {params:,}")
                else:
                    peaks, step_ms = trained(keel, d, data, tag, model,
                                             "none" if shard == "baseline" else shard, malloc,
                                             args)
                rss[(shard, malloc)].append(peaks)
                ms[(shard, malloc)].append(step_ms)
                print(f"round {r + 1} {shard:10s} malloc_tuning={str(malloc).lower():5s} "
                      f"peak RSS {' / '.join(f'{p:.1f}' for p in peaks)} MiB  "
                      f"step {step_ms:.0f} ms", flush=True)

    def spread(xs):
        return f"{statistics.median(xs):.3f} [{min(xs):.3f}]"

    print(f"\nP = {params:,}; peak RSS and B/param: median over rounds [min]; B/param = (peak "
          f"RSS - the baseline's peak RSS, same rank and malloc setting; fsdp2's baseline is "
          f"fsdp2-base) / P; expected: fp32 AdamW arithmetic at W = {WORLD}; step ms: median "
          f"over rounds; vs none: step time / keel's none's, per round, median [min, max]"
          + ("; fsdp2/keel: fsdp2 / keel's parameters, per round, step time and each rank's "
             "peak RSS, median [min]" if args.fsdp2 else ""))
    ranks = range(WORLD)
    print(f"{'mode':10s} {'malloc_tuning':13s} "
          + "".join(f"{f'peak RSS rank {k} MiB':20s} " for k in ranks)
          + "".join(f"{f'B/param rank {k}':15s} " for k in ranks)
          + f"{'expected':8s} {'step ms':7s}  {'vs none':21s}"
          + ("  fsdp2/keel: step" + "".join(f", peak rank {k}" for k in ranks)
             if args.fsdp2 else ""))
    for shard, malloc in configs:
        per_rank = [[round_[k] for round_ in rss[(shard, malloc)]] for k in range(WORLD)]
        line = f"{shard:10s} {str(malloc).lower():13s} "
        for k in range(WORLD):
            line += f"{f'{statistics.median(per_rank[k]):.1f} [{min(per_rank[k]):.1f}]':20s} "
        step = f"{statistics.median(ms[(shard, malloc)]):7.0f}"
        if shard in ("baseline", "fsdp2-base"):
            print(line + "".join(f"{'':15s} " for _ in range(WORLD)) + f"{'':8s} {step}")
            continue
        base = "fsdp2-base" if shard == "fsdp2" else "baseline"
        base = [[round_[k] for round_ in rss[(base, malloc)]] for k in range(WORLD)]
        for k in range(WORLD):
            above = [(a - b) * 1048576 / params for a, b in zip(per_rank[k], base[k])]
            line += f"{f'{statistics.median(above):.2f} [{min(above):.2f}]':15s} "
        line += f"{expected('parameters' if shard == 'fsdp2' else shard):8.0f} {step}  "
        if shard != "fsdp2" and "none" in modes:
            ratios = [a / b for a, b in zip(ms[(shard, malloc)], ms[("none", malloc)])]
            line += (f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, "
                     f"{max(ratios):.3f}]").ljust(21)
        else:
            line += " " * 21
        if shard == "fsdp2" and "parameters" in modes:
            keel_p = ("parameters", malloc)
            step_r = [a / b for a, b in zip(ms[(shard, malloc)], ms[keel_p])]
            line += f"  {spread(step_r)}"
            for k in range(WORLD):
                peak_r = [a[k] / b[k] for a, b in zip(rss[(shard, malloc)], rss[keel_p])]
                line += f", {spread(peak_r)}"
        print(line.rstrip())


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fsdp2-worker"]:
        fsdp2_worker(sys.argv[2:])
    else:
        main()
