"""keel against a plain Python PyTorch loop (the same LibTorch build, the same thread settings).

For each workload, R rounds alternate one `keel train` run and one Python run of the same
training (same model, data, batch size, optimizer, clipping; constant lr), and compare the
steady-state time per optimizer step and the page faults per step.

keel's step time comes from its own metrics.jsonl (the `step_time_ms` of the last log window,
so start-up and the first window are excluded); its page faults per step from two runs of
different lengths (the difference cancels start-up). The Python loop is timed the same way:
the last window of the same length.

Usage: bench_vs_python.py KEEL_BINARY SOURCE_ROOT [--rounds R] [--only NAME]
Prints one line per workload and the ratio python/keel (> 1: keel is faster).
"""
import argparse
import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import keel_threads  # noqa: E402  (bench/keel_threads.py)
import paired  # noqa: E402  (bench/paired.py)

DATA = "/usr/share/datasets/fashion-mnist"

WORKLOADS = {
    # name: (model table, batch size, steps, log window)
    "mlp": ('type = "mlp"\nhidden = [256, 128]\n', 64, 1200, 400),
    "cnn": ('type = "cnn"\n', 64, 90, 30),
    "mlp_wide": ('type = "mlp"\nhidden = [2048, 2048]\n', 256, 240, 80),
}


def python_model(name):
    if name == "cnn":
        return torch.nn.Sequential(
            torch.nn.Conv2d(1, 32, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(7 * 7 * 64, 1024), torch.nn.ReLU(),
            torch.nn.Dropout(0.4), torch.nn.Linear(1024, 10))
    sizes = [784] + ([256, 128] if name == "mlp" else [2048, 2048]) + [10]
    layers = [torch.nn.Flatten()]
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def load_train():
    with gzip.open(f"{DATA}/train-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{DATA}/train-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(y.astype(np.int64))


def python_run(name, batch, steps, window, data):
    torch.manual_seed(0)
    model = python_model(name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    x, y = data
    gen = torch.Generator().manual_seed(0)
    perm, pos, epoch = torch.randperm(len(x), generator=gen), 0, 0
    times = []
    faults0 = None
    for step in range(steps):
        if step == steps - window:
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        if pos + batch > len(x):
            epoch += 1
            perm, pos = torch.randperm(len(x), generator=gen), 0
        idx = perm[pos:pos + batch]
        pos += batch
        xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        loss.item()
        times.append(time.perf_counter() - t0)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    return 1e3 * sum(times[-window:]) / window, faults / window


def keel_manifest(d, name, batch, steps, window):
    model, _, _, _ = WORKLOADS[name]
    text = f"""hooks = [{{ type = "jsonl" }}]
[run]
name = "bench-{name}"
output_dir = "{d}/run"
seed = 0
mode = "train"
[train]
epochs = 0
max_steps = {steps}
log_every = {window}
[model]
{model}
[data.train]
type = "fashion_mnist"
split = "train"
batch_size = {batch}
[optimizer]
type = "adamw"
lr = 1e-3
weight_decay = 0.01
[loss]
type = "cross_entropy"
[grad_clipper]
type = "norm"
max_norm = 5.0
"""
    path = os.path.join(d, f"{name}.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def keel_run(keel, name, batch, steps, window):
    """Returns (ms per step of the last window, minor page faults of the whole process)."""
    with tempfile.TemporaryDirectory() as d:
        m = keel_manifest(d, name, batch, steps, window)
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
        subprocess.run([keel, "train", m], check=True, capture_output=True)
        faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before
        with open(f"{d}/run/metrics.jsonl") as f:
            last = [json.loads(line) for line in f][-1]
        return last["step_time_ms"], faults


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("keel")
    ap.add_argument("root")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only")
    args = ap.parse_args()
    threads = keel_threads.apply()
    data = load_train()
    print(f"bench_vs_python: {threads}; {args.rounds} rounds (median); load average "
          f"{os.getloadavg()[0]:.2f} before")
    for name, (_, batch, steps, window) in WORKLOADS.items():
        if args.only and name != args.only:
            continue
        python_run(name, batch, window, window // 2, data)  # warm-up
        keel_ms, py_ms = [], []
        for r in range(args.rounds):
            order = [0, 1] if r % 2 == 0 else [1, 0]
            for side in order:
                if side == 0:
                    keel_ms.append(keel_run(args.keel, name, batch, steps, window)[0])
                else:
                    py_ms.append(python_run(name, batch, steps, window, data)[0])
        # Page faults per step: keel from two run lengths, Python in-process.
        _, f_short = keel_run(args.keel, name, batch, steps - window, window)
        _, f_long = keel_run(args.keel, name, batch, steps, window)
        keel_faults = max(0, f_long - f_short) / window
        py_faults = python_run(name, batch, steps, window, data)[1]
        k, p = statistics.median(keel_ms), statistics.median(py_ms)
        print(f"{name:9s} batch {batch:4d}: keel {k:8.3f} ms/step, python {p:8.3f} ms/step, "
              f"python/keel = {p / k:.3f}   page faults/step: keel {keel_faults:.1f}, "
              f"python {py_faults:.1f}", flush=True)
        # The same rounds paired: round r's python/keel (both runs of a round back to back).
        print(f"{name:9s} paired python/keel per round: "
              f"{', '.join(f'{q / c:.3f}' for q, c in zip(py_ms, keel_ms))}; "
              + paired.verdict([q / c for q, c in zip(py_ms, keel_ms)]), flush=True)
    print(f"bench_vs_python: load average {os.getloadavg()[0]:.2f} after", flush=True)


if __name__ == "__main__":
    sys.exit(main())
