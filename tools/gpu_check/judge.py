#!/usr/bin/env python3
"""Judges one run of the GPU check (tools/gpu_check/run.sh) from its run directory's
metrics.jsonl and run.log, and prints one line: `PASS<TAB>numbers` or `FAIL<TAB>why`.

    judge.py quickstart RUN_DIR MIN_ACCURACY
    judge.py lm RUN_DIR STEPS [BACKEND]         loss finite and falling, STEPS steps; with
                                                BACKEND, run.log's "rank 0 of 1 ..., BACKEND
                                                backend" line (a process group was formed)
    judge.py mfu RUN_DIR MIN_PEAK_TFLOPS        the last training record's mfu and the measured
                                                peak it divides by
    judge.py resume RUN_DIR FROM_STEP TO_STEP   a run resumed from checkpoint step FROM_STEP
                                                trained on to TO_STEP without starting over
Standard library only: it runs under the GPU machine's Python.
"""
import json
import math
import os
import re
import sys


def records(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        raise Failure(f"no {path}")
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
    return out


def run_log(run_dir):
    path = os.path.join(run_dir, "run.log")
    return open(path, errors="replace").read() if os.path.exists(path) else ""


class Failure(Exception):
    pass


def train_records(recs):
    train = [r for r in recs if r.get("split") == "train"]
    if not train:
        raise Failure("no training record in metrics.jsonl")
    bad = [r["step"] for r in train if not math.isfinite(r.get("loss", float("nan")))]
    if bad:
        raise Failure(f"loss not finite at step(s) {bad[:5]}")
    return train


def speed(train):
    """Steps per second over the training windows after the first (start-up, CUDA's lazy
    initialisation and the peak measurement land in the first), or over all when only one."""
    windows, prev = [], 0
    for r in train:
        windows.append((r["step"] - prev, r.get("step_time_ms", 0.0), r.get("tokens_per_s")))
        prev = r["step"]
    use = windows[1:] if len(windows) > 1 else windows
    steps = sum(n for n, _, _ in use)
    ms = sum(n * t for n, t, _ in use)
    return steps / (ms / 1000.0) if ms > 0 else float("nan")


def quickstart(run_dir, min_accuracy):
    recs = records(run_dir)
    train = train_records(recs)
    tests = [r for r in recs if r.get("split") == "test"]
    if not tests or "accuracy" not in tests[-1]:
        raise Failure("no test record with an accuracy in metrics.jsonl")
    acc = tests[-1]["accuracy"]
    line = (f"{train[-1]['step']} steps, {speed(train):.0f} steps/s, "
            f"{train[-1].get('samples_per_s', 0):.0f} samples/s, test accuracy {acc:.4f}")
    if not acc >= float(min_accuracy):
        raise Failure(f"{line}: below {min_accuracy}")
    return line


def lm(run_dir, steps, backend=None):
    recs = records(run_dir)
    train = train_records(recs)
    last = train[-1]
    first_loss, last_loss = train[0]["loss"], last["loss"]
    line = (f"{last['step']} steps, loss {first_loss:.3f} -> {last_loss:.3f}, "
            f"{speed(train):.1f} steps/s, {last.get('tokens_per_s', 0):.0f} tokens/s")
    if "loss_scale" in last:
        line += (f", loss scale {last['loss_scale']:g}, "
                 f"{sum(r.get('skipped_steps', 0) for r in train)} skipped steps")
    if last["step"] != int(steps):
        raise Failure(f"{line}: ended at step {last['step']}, not {steps}")
    if len(train) < 2 or not last_loss < 0.9 * first_loss:
        raise Failure(f"{line}: the loss did not fall (the last window's mean is not below 0.9 "
                      "times the first's)")
    if backend:
        m = re.search(r"rank 0 of (\d+) \(([^,]*), [^)]*\), (\w+) backend, device (\S+)",
                      run_log(run_dir))
        if not m:
            raise Failure(f"{line}: run.log has no 'rank 0 of N (...), BACKEND backend' line: "
                          "keel formed no process group (under a launcher it forms one for several "
                          "processes, or for one with distributed.shard set: "
                          "kernel/run/assemble.cpp, join_ranks)")
        if m.group(3) != backend:
            raise Failure(f"{line}: the process group's backend is {m.group(3)}, not {backend}")
        line += f", {m.group(3)} group of {m.group(1)} rank(s) on {m.group(4)}"
    return line


def mfu(run_dir, min_peak):
    recs = records(run_dir)
    train = train_records(recs)
    last = train[-1]
    peak = last.get("mfu_peak_tflops")
    if peak is None:
        raise Failure("the training records have no mfu_peak_tflops (no [mfu] table?)")
    # The calculator's line "[mfu] peak P TFLOP/s per device, measured now (...)" (or under
    # load, or cached, or from the manifest) says where the peak came from.
    source = re.findall(r"\[mfu\] peak \S+ TFLOP/s per device, ([^(:\n]*)", run_log(run_dir))
    where = f", {source[-1].strip()}" if source else ""
    if "mfu" not in last:
        raise Failure(f"the last record has no mfu (above 1 against a peak of {peak:.4g} "
                      f"TFLOP/s, so the peak is too low{where})")
    line = (f"mfu {last['mfu']:.4f} at step {last['step']} against a measured peak of "
            f"{peak:.4g} TFLOP/s (float32 matmul{where})")
    if not 0 < last["mfu"] <= 1:
        raise Failure(f"{line}: not in (0, 1]")
    if not peak >= float(min_peak):
        raise Failure(f"{line}: the peak is below {min_peak} TFLOP/s, so it was not measured on "
                      "the GPU")
    return line


def resume(run_dir, from_step, to_step):
    recs = records(run_dir)
    train = train_records(recs)
    from_step, to_step = int(from_step), int(to_step)
    before = [r for r in train if r["step"] <= from_step]
    after = [r for r in train if r["step"] > from_step]
    if not before or not after:
        raise Failure(f"metrics.jsonl has {len(before)} training record(s) up to step "
                      f"{from_step} and {len(after)} after it")
    line = (f"saved at step {from_step} (loss {before[-1]['loss']:.3f}), resumed to step "
            f"{after[-1]['step']} (loss {after[-1]['loss']:.3f})")
    if after[-1]["step"] != to_step:
        raise Failure(f"{line}: ended at step {after[-1]['step']}, not {to_step}")
    if not after[0]["loss"] < 0.9 * train[0]["loss"]:
        raise Failure(f"{line}: the first loss after the resume is not below 0.9 times the "
                      "run's first (it started over?)")
    if not os.path.isdir(os.path.join(run_dir, "checkpoints", f"step-{to_step}")):
        raise Failure(f"{line}: no checkpoints/step-{to_step}")
    return line


def ctr(run_dir, min_auc, device):
    """The CTR model's run: a test record with an AUC of at least min_auc, and run.log saying
    the sparse optimizer got the tables' rows as tensors on `device` (cuda: any CUDA device)."""
    recs = records(run_dir)
    train = train_records(recs)
    tests = [r for r in recs if r.get("split") == "test" and "auc" in r]
    if not tests:
        raise Failure("no test record with an auc in metrics.jsonl")
    auc = tests[-1]["auc"]
    line = (f"{train[-1]['step']} steps, {train[-1].get('samples_per_s', 0):.0f} samples/s, "
            f"{train[-1].get('table_rows', 0)} table rows, test auc {auc:.4f}")
    m = re.search(r"rows as tensors on (\S+)\)", run_log(run_dir))
    if not m:
        raise Failure(f"{line}: run.log does not say the tables hand their rows as tensors "
                      "('rows as tensors on DEVICE')")
    if not m.group(1).startswith(device):
        raise Failure(f"{line}: the tables' rows are on {m.group(1)}, not {device}")
    line += f", rows on {m.group(1)}"
    if not auc >= float(min_auc):
        raise Failure(f"{line}: below {min_auc}")
    return line


def main():
    kinds = {"quickstart": quickstart, "lm": lm, "mfu": mfu, "resume": resume, "ctr": ctr}
    if len(sys.argv) < 3 or sys.argv[1] not in kinds:
        print("FAIL\tusage: judge.py quickstart|lm|mfu|resume|ctr RUN_DIR ...")
        return 2
    try:
        print("PASS\t" + kinds[sys.argv[1]](*sys.argv[2:]))
    except Failure as e:
        print(f"FAIL\t{e}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"FAIL\tcannot read {sys.argv[2]}: {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
