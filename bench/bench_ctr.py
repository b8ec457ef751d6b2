"""keel's CTR model (dlrm + sparse adagrad on hash-table embeddings) against the same model in a
plain PyTorch loop (nn.EmbeddingBag(sparse=True) over pre-sized tables with a modulo hash,
torch.optim.Adagrad on their sparse gradients, Adam on the dense part); the same LibTorch
build and thread settings (bench/keel_threads.py).

Data: keel-criteo-generate writes two windows of Criteo-format records once; keel reads them
with its criteo dataset (background parsing), the Python loop gets them parsed into tensors
before it is timed (its batches cost it nothing per step).

Each round runs `keel train` once and the Python loop once (alternating which goes first), both
for STEPS steps of BATCH samples, and compares the steady-state samples per second: keel's from
its metrics.jsonl (the last log window, a third of the steps: start-up excluded), Python's from
the same last third of its steps. It prints, per round, both and the ratio keel/python, then the
ratios' min, median and the sign-test interval of the median (bench/paired.py, at 90% coverage); then
where a step's time goes: in keel, the profiler's phases (forward, which holds the table
lookups and the interaction, backward, optimizer and sparse_optimizer, from one profiled run);
in the Python loop, timers around the lookup, the interaction, the MLPs, the backward and the
two updates.

Usage: bench_ctr.py KEEL_BINARY BUILD_DIR [--rounds R] [--steps S] [--batch B]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

import keel_threads  # noqa: E402  (bench/keel_threads.py)
from paired import summary  # noqa: E402

DIM, BOTTOM, TOP = 16, [32, 16], [64, 32]
HASH_ROWS = 100003  # the Python tables' rows per feature (ids are taken modulo this)
RECORDS = 60000     # per window


def generate(build, d):
    gen = os.path.join(build, "plugins/criteo/keel-criteo-generate")
    subprocess.run([gen, "--output", d, "--windows", "2", "--records", str(RECORDS),
                    "--seed", "3"], check=True, capture_output=True)
    return sorted(f for f in os.listdir(d) if f.endswith(".tsv"))


def parse(path):
    """One window as (dense float32 [N, 13], ids int64 [N, 26] with -1 for missing, labels
    float32 [N]), transformed as the criteo dataset does (log(1 + max(x, 0)), missing -> 0)."""
    labels, dense, ids = [], [], []
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            labels.append(float(fields[0]))
            dense.append([np.log1p(max(float(x), 0.0)) if x else 0.0 for x in fields[1:14]])
            ids.append([int(x, 16) if x else -1 for x in fields[14:40]])
    return (torch.tensor(dense, dtype=torch.float32), torch.tensor(ids, dtype=torch.int64),
            torch.tensor(labels, dtype=torch.float32))


class Dlrm(torch.nn.Module):
    """plugins/ctr's dlrm (interaction "dot", tables per feature), with EmbeddingBag tables."""

    def __init__(self):
        super().__init__()
        widths = [13] + BOTTOM
        self.bottom = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.tables = torch.nn.ModuleList(
            torch.nn.EmbeddingBag(HASH_ROWS, DIM, mode="sum", sparse=True) for _ in range(26))
        for t in self.tables:
            torch.nn.init.normal_(t.weight, std=0.01)
        width = DIM + 27 * 26 // 2
        widths = [width] + TOP
        self.top = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.out = torch.nn.Linear(TOP[-1], 1)
        self.pairs = torch.tensor([i * 27 + j for i in range(27) for j in range(i)])
        self.timers = None

    def tick(self, name, t0):
        t1 = time.perf_counter()
        if self.timers is not None:
            self.timers[name] = self.timers.get(name, 0.0) + t1 - t0
        return t1

    def forward(self, dense, bags):
        t = time.perf_counter()
        x = dense
        for fc in self.bottom:
            x = F.relu(fc(x))
        t = self.tick("mlp", t)
        e = torch.stack([table(i, o) for table, (i, o) in zip(self.tables, bags)], 1)
        t = self.tick("lookup", t)
        v = torch.cat([x.unsqueeze(1), e], 1)
        z = torch.cat([x, torch.bmm(v, v.transpose(1, 2)).flatten(1).index_select(1, self.pairs)], 1)
        t = self.tick("interaction", t)
        for fc in self.top:
            z = F.relu(fc(z))
        z = self.out(z).reshape(-1)
        self.tick("mlp", t)
        return z


def bags_of(ids):
    """Per feature: the present ids modulo HASH_ROWS and the offsets of one bag per sample (a
    missing id is an empty bag, zeros, as in keel)."""
    out = []
    for f in range(ids.shape[1]):
        col = ids[:, f]
        present = col >= 0
        counts = present.long()
        offsets = torch.cumsum(counts, 0) - counts
        out.append(((col[present] % HASH_ROWS).contiguous(), offsets))
    return out


def python_run(data, batch, steps, timers=None):
    torch.manual_seed(0)
    model = Dlrm()
    model.timers = timers
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
    adam = torch.optim.Adam(dense_params, lr=1e-3)
    adagrad = torch.optim.Adagrad(model.tables.parameters(), lr=0.02, eps=1e-8)
    dense, ids, labels = data
    n = dense.shape[0] // batch
    batches = [(dense[i * batch:(i + 1) * batch], bags_of(ids[i * batch:(i + 1) * batch]),
                labels[i * batch:(i + 1) * batch]) for i in range(min(n, steps))]
    times = []
    for step in range(steps):
        x, bags, y = batches[step % len(batches)]
        t0 = time.perf_counter()
        adam.zero_grad(set_to_none=True)
        adagrad.zero_grad(set_to_none=True)
        loss = F.binary_cross_entropy_with_logits(model(x, bags), y)
        t = time.perf_counter()
        loss.backward()
        t = model.tick("backward", t)
        adagrad.step()
        t = model.tick("sparse update", t)
        adam.step()
        t = model.tick("dense update", t)
        loss.item()
        times.append(time.perf_counter() - t0)
    window = steps // 3
    return batch * window / sum(times[-window:])


def keel_manifest(d, data_dir, batch, steps, profile):
    text = f"""hooks = [{{ type = "jsonl" }}]
[run]
name = "bench-ctr"
output_dir = "{d}/run"
seed = 0
[train]
epochs = 0
max_steps = {steps}
log_every = {steps // 3}
[model]
type = "dlrm"
embedding_dim = {DIM}
bottom_mlp = {BOTTOM}
top_mlp = {TOP}
interaction = "dot"
tables = "per_feature"
[data.train]
type = "criteo"
path = "{data_dir}"
pattern = "*.tsv"
batch_size = {batch}
[optimizer]
type = "adam"
lr = 1e-3
[sparse_optimizer]
type = "adagrad"
lr = 0.02
eps = 1e-8
[loss]
type = "bce"
"""
    if profile:
        text += '[profiler]\ntype = "chrome_trace"\n'
    path = os.path.join(d, "bench.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def keel_run(keel, data_dir, batch, steps, profile=False):
    """keel's samples per second over the last log window; with `profile`, also the share of
    each profiler phase in the steps' time (from the Chrome trace)."""
    with tempfile.TemporaryDirectory() as d:
        m = keel_manifest(d, data_dir, batch, steps, profile)
        subprocess.run([keel, "train", m], check=True, capture_output=True)
        with open(f"{d}/run/metrics.jsonl") as f:
            last = [r for r in map(json.loads, f) if r["split"] == "train"][-1]
        shares = trace_shares(f"{d}/run") if profile else None
        return last["samples_per_s"], shares


def trace_shares(run_dir):
    """Seconds per phase name from the run's Chrome trace (complete events "X")."""
    with open(os.path.join(run_dir, "trace.json")) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    total = {}
    for e in events:
        if e.get("ph") == "X":
            total[e["name"]] = total.get(e["name"], 0.0) + e["dur"] / 1e6
    return total


def shares_line(seconds, names):
    whole = sum(seconds[n] for n in names if n in seconds)
    return ", ".join(f"{n} {100 * seconds[n] / whole:.0f}%" for n in names if n in seconds)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("keel")
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=90, help="a multiple of 3")
    ap.add_argument("--batch", type=int, default=512)
    args = ap.parse_args()
    if args.steps < 3 or args.steps % 3:
        ap.error("--steps must be a multiple of 3 (the timed window is the last third)")
    threads = keel_threads.apply()
    keel = os.path.abspath(args.keel)
    with tempfile.TemporaryDirectory(prefix="keel-bench-ctr-") as data_dir:
        files = generate(args.build, data_dir)
        data = parse(os.path.join(data_dir, files[0]))
        print(f"bench_ctr: dlrm dim {DIM}, bottom {BOTTOM}, top {TOP}, 26 tables; batch "
              f"{args.batch}, {args.steps} steps, timed the last {args.steps // 3}; "
              f"{threads}; {args.rounds} round(s); load average before "
              f"the run {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
        python_run(data, args.batch, args.steps // 3)  # warm-up
        ratios = []
        for r in range(args.rounds):
            order = ["keel", "python"] if r % 2 == 0 else ["python", "keel"]
            got = {}
            for side in order:
                got[side] = (keel_run(keel, data_dir, args.batch, args.steps)[0] if side == "keel"
                             else python_run(data, args.batch, args.steps))
            ratios.append(got["keel"] / got["python"])
            print(f"round {r + 1}: keel {got['keel']:9.0f} samples/s, python "
                  f"{got['python']:9.0f} samples/s, keel/python {ratios[-1]:.3f}", flush=True)
        print(f"keel/python samples/s: {summary(ratios, interval=True, level=0.9)}")
        _, phases = keel_run(keel, data_dir, args.batch, args.steps, profile=True)
        print("keel, share of the profiled phases: " +
              shares_line(phases, ["data", "forward", "backward", "clip", "optimizer",
                                   "sparse_optimizer"]))
        timers = {}
        python_run(data, args.batch, args.steps, timers)
        print("python, share of the step: " +
              shares_line(timers, ["lookup", "interaction", "mlp", "backward", "sparse update",
                                   "dense update"]))


if __name__ == "__main__":
    sys.exit(main())
