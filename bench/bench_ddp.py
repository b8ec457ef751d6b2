"""keel's data parallelism against PyTorch's DistributedDataParallel (issue 9).

Four configurations of the same per-rank training (the "cnn" workload of bench_vs_python.py:
conv5x5 32, pool, conv5x5 64, pool, fc 1024, dropout 0.4, fc 10; Fashion-MNIST, per-rank batch
B, AdamW lr 1e-3 weight decay 0.01, cross entropy, no clipping, no evaluation, no checkpoint;
one intra-op thread per process, OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 in every
process's environment):

  keel ddp     torchrun --nproc_per_node=2 keel train: 2 ranks, Gloo, c10d::Reducer, global
               batch 2B. Rank 0's metrics.jsonl gives samples/s (all ranks) and the step time
               (the slowest rank's window time / steps), its run.log the collectives keel
               issued per step (its `collectives:` line; "not logged" by a keel without it).
  torch ddp    the same torchrun running this file with --worker --ddp: init_process_group
               ("gloo"), the same CNN in DistributedDataParallel (default buckets: 25 MiB), each
               rank taking every 2nd sample of one seeded permutation, zero_grad(set_to_none),
               forward, cross_entropy, backward, AdamW step, loss.item() every step. Each rank
               times the same window as keel's and writes it to a file; global samples/s =
               2B / the slowest rank's step time (keel's definition).
  keel alone   two plain `keel train` processes (no launcher variables, so no process group),
               each batch B, started together.
  torch alone  two workers without --ddp (no process group, no DDP wrapper), each batch B,
               started together.

Timing window: train.max_steps = N and train.log_every = N/3; keel's last metrics record (steps
2N/3+1 .. N, so start-up, the first steps and the bucket rebuild are outside it). The Python
worker times the same steps with perf_counter around them.

Exposed synchronisation cost. In a synced run part of the all-reduce overlaps backward; only
what is not hidden lengthens the step. Running the same per-rank work as two unsynchronised
processes started at the same time keeps the CPU contention of two busy processes on the
machine, but removes all synchronisation. For each side:

    exposed fraction = (step ms synced - step ms alone) / step ms synced

where "step ms alone" is the slower of the two unsynchronised processes' step times (the synced
step time is the slowest rank's too). It counts everything data parallelism adds to a step:
the all-reduces not hidden by backward, copying gradients into and out of buckets, waiting for
the slower rank, DDP's Python forward wrapper (PyTorch), and keel's three small all-reduces
per step that keep the ranks agreed (kernel/run/agreement.hpp: cross_entropy counts items, so
the step's item count; the loss, sample count and non-finite flag; the hooks' requests and
signals and the window's times; the first two overlap the forward and backward, the last
waits), which the Python worker does not do.

R rounds (default 9) run the four configurations, the order reversed every other round. Each
round prints its numbers; the summary gives the median over rounds of the samples/s ratio
keel/PyTorch (> 1: keel faster) with its 95% sign-test interval and a verdict (bench/paired.py:
keel ahead, behind or not told apart, whether the target, a median of at least 1.10 with the
interval above 1.0, is met, and whether the interval is too wide to judge a 5% difference), and the min and median
of both exposed fractions.

Usage: bench_ddp.py KEEL_BINARY SOURCE_ROOT [--rounds R] [--steps N] [--batch B]
       (defaults R = 9, N = 60, B = 32; about 8 minutes on the 2-core machine; SOURCE_ROOT is not used, the command line is
       bench_vs_python.py's)
The worker: bench_ddp.py --worker [--ddp] --batch B --steps N --window W --out PREFIX writes
PREFIX.rank<r>.json with the seconds of its last W steps.
Run it on an otherwise idle machine: the header prints the load average before the run.
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
import time

# Before torch is imported: one thread per process for LibTorch and OpenBLAS.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench_vs_python import WORKLOADS, load_train, python_model  # noqa: E402
import keel_threads  # noqa: E402  (bench/keel_threads.py; only its environment line)
import paired  # noqa: E402  (bench/paired.py)

# torchrun of the Python running this script (its torch: Debian's python3-torch under
# /usr/bin/python3, the wheel's under its venv), not whichever `torchrun` the PATH finds first.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--no_python", "--redirects", "1",
            "--tee", "1"]
WORLD = 2
TIMEOUT_S = 600
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_", "SLURM_", "OMPI_")


# ---------------------------------------------------------------- the PyTorch worker


def worker(args):
    torch.set_num_threads(1)
    if args.ddp:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    x, y = load_train()
    torch.manual_seed(0)
    model = python_model("cnn")
    if args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)  # bucket_cap_mb=25
    torch.manual_seed(1000003 * rank)  # dropout masks differ between ranks, as in keel
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    epoch, pos = 0, 0
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))[rank::world]
    start = None
    for step in range(args.steps):
        if step == args.steps - args.window:
            start = time.perf_counter()
        if pos + args.batch > len(perm):
            epoch, pos = epoch + 1, 0
            gen = torch.Generator().manual_seed(epoch * 1000003)
            perm = torch.randperm(len(x), generator=gen)[rank::world]
        idx = perm[pos:pos + args.batch]
        pos += args.batch
        xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        loss.item()
    secs = time.perf_counter() - start
    with open(f"{args.out}.rank{rank}.json", "w") as f:
        json.dump({"rank": rank, "world": world, "steps": args.window, "secs": secs}, f)
    if args.ddp:
        dist.destroy_process_group()


# ---------------------------------------------------------------- the driver


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env():
    """This environment without launcher variables (so a plain keel process runs alone)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(LAUNCH_VARS)}


def torchrun(d, cmd):
    return TORCHRUN + [f"--nproc_per_node={WORLD}", "--master_addr=127.0.0.1",
                       f"--master_port={free_port()}", f"--log_dir={d}/torchrun-logs"] + cmd


def run_together(name, cmds):
    """Starts every command at once, waits for all; on a failure prints its output, exits 1."""
    logs = [tempfile.TemporaryFile("w+") for _ in cmds]  # files: no pipe fills up and blocks
    procs = [subprocess.Popen(c, env=clean_env(), stdout=log, stderr=subprocess.STDOUT,
                              text=True) for c, log in zip(cmds, logs)]
    for cmd, p, log in zip(cmds, procs, logs):
        try:
            p.wait(timeout=TIMEOUT_S)
            status = f"exit status {p.returncode}"
        except subprocess.TimeoutExpired:
            p.terminate()  # SIGTERM: torchrun passes it on to its workers
            p.wait()
            status = f"stopped after {TIMEOUT_S} s"
        if p.returncode != 0:
            for q in procs:
                if q.poll() is None:
                    q.terminate()
                    q.wait()
            log.seek(0)
            tail = "\n".join(log.read().splitlines()[-40:])
            print(f"bench_ddp: {name} failed ({status}): {' '.join(cmd)}\n"
                  f"--- last lines of its output ---\n{tail}", file=sys.stderr)
            sys.exit(1)
    for log in logs:
        log.close()


def keel_manifest(d, tag, args):
    model = WORKLOADS["cnn"][0]
    path = os.path.join(d, f"{tag}.toml")
    with open(path, "w") as f:
        f.write(f"""hooks = [{{ type = "jsonl" }}]
[run]
name = "bench-ddp-{tag}"
output_dir = "{d}/{tag}"
seed = 0
threads = 1
mode = "train"
[train]
epochs = 0
max_steps = {args.steps}
log_every = {args.steps // 3}
[model]
{model}
[data.train]
type = "fashion_mnist"
split = "train"
batch_size = {args.batch}
[optimizer]
type = "adamw"
lr = 1e-3
weight_decay = 0.01
[loss]
type = "cross_entropy"
""")
    return path


def keel_record(d, tag, args):
    """The last train record of the run in d/tag (steps 2N/3+1 .. N)."""
    with open(f"{d}/{tag}/metrics.jsonl") as f:
        records = [r for r in map(json.loads, f) if r.get("split") == "train"]
    last = records[-1]
    if last["step"] != args.steps:
        sys.exit(f"bench_ddp: {d}/{tag}/metrics.jsonl ends at step {last['step']}, "
                 f"not {args.steps}")
    return last


def keel_collectives(d, tag):
    """What rank 0's run.log says keel issued per step ("X per step: A agreements, B gradient
    bucket all-reduces"), or "not logged" (a keel without the `collectives:` line)."""
    with open(f"{d}/{tag}/run.log") as f:
        m = re.search(r"collectives: \d+ in (\d+) steps \(([\d.]+) per step: (\d+) agreements, "
                      r"(\d+) gradient bucket all-reduces\)", f.read())
    if not m:
        return "not logged"
    steps, per_step, agreements, all_reduces = m.groups()
    return (f"{per_step} per step ({int(agreements) / int(steps):g} agreements, "
            f"{int(all_reduces) / int(steps):g} gradient bucket all-reduces)")


def keel_ddp(keel, d, args):
    m = keel_manifest(d, "keel-ddp", args)
    run_together("keel ddp", [torchrun(d, [keel, "train", m])])
    r = keel_record(d, "keel-ddp", args)
    return r["samples_per_s"], r["step_time_ms"], keel_collectives(d, "keel-ddp")


def keel_alone(keel, d, args):
    ms = [keel_manifest(d, f"keel-alone{i}", args) for i in range(WORLD)]
    run_together("keel alone", [[keel, "train", m] for m in ms])
    return [keel_record(d, f"keel-alone{i}", args)["step_time_ms"] for i in range(WORLD)]


def worker_cmd(args, out, ddp):
    return ([sys.executable, os.path.abspath(__file__), "--worker", "--batch", str(args.batch),
             "--steps", str(args.steps), "--window", str(args.steps // 3), "--out", out]
            + (["--ddp"] if ddp else []))


def worker_ms(path):
    with open(path) as f:
        r = json.load(f)
    return 1e3 * r["secs"] / r["steps"]


def torch_ddp(d, args):
    out = f"{d}/torch-ddp"
    run_together("torch ddp", [torchrun(d, worker_cmd(args, out, True))])
    ms = max(worker_ms(f"{out}.rank{r}.json") for r in range(WORLD))
    return 1e3 * WORLD * args.batch / ms, ms


def torch_alone(d, args):
    outs = [f"{d}/torch-alone{i}" for i in range(WORLD)]
    run_together("torch alone", [worker_cmd(args, o, False) for o in outs])
    return [worker_ms(f"{o}.rank0.json") for o in outs]


def exposed(synced_ms, alone_ms):
    return (synced_ms - max(alone_ms)) / synced_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("keel", nargs="?")
    ap.add_argument("root", nargs="?")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=60, help="a multiple of 3")
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ddp", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--window", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if not args.keel or not args.root:
        ap.error("KEEL_BINARY and SOURCE_ROOT are required")
    if args.steps < 3 or args.steps % 3:
        ap.error("--steps must be a multiple of 3 (the timed window is the last third)")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    keel = os.path.abspath(args.keel)
    print(f"bench_ddp: cnn, {WORLD} ranks x batch {args.batch} (global {WORLD * args.batch}), "
          f"{args.steps} steps, timed steps {args.steps - args.steps // 3 + 1}..{args.steps}; "
          f"1 thread per process; torch {torch.__version__}; {args.rounds} round(s); "
          f"load average before the run {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
          f"{keel_threads.environment()}", flush=True)
    configs = ["keel ddp", "torch ddp", "keel alone", "torch alone"]
    ratio, keel_exp, torch_exp = [], [], []
    absolute = {"keel sps": [], "keel ms": [], "torch sps": [], "torch ms": []}
    for r in range(args.rounds):
        res = {}
        order = configs if r % 2 == 0 else configs[::-1]
        with tempfile.TemporaryDirectory(prefix="keel-bench-ddp-") as d:
            for c in order:
                if c == "keel ddp":
                    res[c] = keel_ddp(keel, d, args)
                elif c == "torch ddp":
                    res[c] = torch_ddp(d, args)
                elif c == "keel alone":
                    res[c] = keel_alone(keel, d, args)
                else:
                    res[c] = torch_alone(d, args)
        (k_sps, k_ms, k_collectives), (t_sps, t_ms) = res["keel ddp"], res["torch ddp"]
        k_alone, t_alone = res["keel alone"], res["torch alone"]
        ratio.append(k_sps / t_sps)
        for key, v in zip(absolute, (k_sps, k_ms, t_sps, t_ms)):
            absolute[key].append(v)
        keel_exp.append(exposed(k_ms, k_alone))
        torch_exp.append(exposed(t_ms, t_alone))
        print(f"round {r + 1} ({', '.join(order)})\n"
              f"  keel : ddp {k_sps:7.1f} samples/s {k_ms:7.2f} ms/step   alone "
              f"{' / '.join(f'{x:.2f}' for x in k_alone)} ms/step   exposed sync "
              f"{keel_exp[-1]:.3f}\n"
              f"  keel collectives: {k_collectives}\n"
              f"  torch: ddp {t_sps:7.1f} samples/s {t_ms:7.2f} ms/step   alone "
              f"{' / '.join(f'{x:.2f}' for x in t_alone)} ms/step   exposed sync "
              f"{torch_exp[-1]:.3f}\n"
              f"  samples/s keel/torch {ratio[-1]:.3f}", flush=True)
    med = {k: statistics.median(v) for k, v in absolute.items()}
    print(f"bench_ddp ddp medians: keel {med['keel sps']:.1f} samples/s {med['keel ms']:.2f} "
          f"ms/step, torch {med['torch sps']:.1f} samples/s {med['torch ms']:.2f} ms/step")
    print(f"bench_ddp summary over {args.rounds} round(s): samples/s keel/torch "
          f"{paired.verdict(ratio, target=1.10)}; exposed sync fraction keel "
          f"{paired.summary(keel_exp)}, torch {paired.summary(torch_exp)}; load average after "
          f"the run {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
