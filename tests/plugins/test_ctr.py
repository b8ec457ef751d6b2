"""The keel-ctr plugin (plugins/ctr) against PyTorch references (python3-torch, the same LibTorch
build), through tests/plugins/ctr_probe (the plugin loaded with keel/testing.hpp), all cases in
one `ctr_probe --batch` process:

loss bce
- the loss of 37 random float32 logits against 0/1 labels within 1e-6 (absolute) of
  F.binary_cross_entropy_with_logits (mean), every element of its gradient within 1e-7; count
  and count_items 37; the loss again under no_grad equal;
- output and target of different lengths: one error line naming both shapes;
- evaluation metrics: on 101 scores with many ties (values k/2, k = 0..4) and random labels, in
  batches of 10 (the last one of 1), `auc` within 1e-12 of the AUC by brute force over every
  (positive, negative) pair (1 when the positive scores higher, 1/2 when tied) and `logloss`
  within 1e-12 of the float64 F.binary_cross_entropy_with_logits mean; the summed state is
  exactly {positives, negatives} and the logloss sum within 1e-9; a second evaluation of the
  first 10 samples gives their own brute-force AUC (the kept pairs were cleared); 2000 scores
  without ties in batches of 64 likewise; all labels 1: no `auc`, `logloss` still there; a NaN
  score: `auc` NaN; a label of 0.5 in evaluation: one error line.

Several ranks (all_gather of the pairs through keel::Comm) are left to the kernel's tests of
keel_comm and to end-to-end runs: keel/testing.hpp gives a component no keel_comm (world 1).

Usage: test_ctr.py PROBE PLUGIN.so
"""
import json
import os
import sys
import tempfile
import time

import numpy
import torch
import torch.nn.functional as F

from probe_batch import Batch

PROBE, PLUGIN = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


BATCH = Batch(PROBE)


def write(path, tensor):
    tensor.contiguous().numpy().tofile(path)


def read(path, dtype, shape):
    return torch.from_numpy(numpy.fromfile(path, dtype=dtype)).view(shape)


def brute_auc(scores, labels):
    pos = [float(s) for s, y in zip(scores, labels) if y == 1]
    neg = [float(s) for s, y in zip(scores, labels) if y == 0]
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def bce_cases(tmp):
    torch.manual_seed(1)
    n = 37
    logits = torch.randn(n) * 3
    labels = (torch.rand(n) < 0.4).float()
    write(os.path.join(tmp, "logits.bin"), logits)
    write(os.path.join(tmp, "labels.bin"), labels)
    text, err = BATCH.run("bce", PLUGIN, tmp, n)
    check(err is None, f"bce: {err}")
    if err is None:
        out = json.loads(text)
        x = logits.clone().requires_grad_(True)
        want = F.binary_cross_entropy_with_logits(x, labels)
        want.backward()
        grad = read(os.path.join(tmp, "grad.bin"), "float32", (n,))
        check(abs(out["loss"] - want.item()) <= 1e-6, f"bce: loss {out['loss']} vs {want.item()}")
        diff = (grad - x.grad).abs().max().item()
        check(diff <= 1e-7, f"bce: max gradient difference {diff}")
        check(out["count"] == n and out["count_items"] == n,
              f"bce: count {out['count']}, count_items {out['count_items']}, expected {n}")
        check(out["no_grad_loss"] == out["loss"], f"bce: no_grad loss {out['no_grad_loss']}")
        print(f"bce: loss {out['loss']:.9f} (torch {want.item():.9f}), max grad diff {diff:.2e}")
    write(os.path.join(tmp, "labels.bin"), labels[:n - 1])
    _, err = BATCH.run("bce", PLUGIN, tmp, n, n - 1)
    check(err is not None and "[37]" in err and "[36]" in err and "\n" not in err,
          f"bce: mismatched shapes: {err}")


def evaluate(tmp, scores, labels, batch):
    write(os.path.join(tmp, "scores.bin"), scores)
    write(os.path.join(tmp, "labels.bin"), labels)
    text, err = BATCH.run("bce_eval", PLUGIN, tmp, len(scores), batch)
    return (json.loads(text), None) if err is None else (None, err)


def eval_case(tmp, what, scores, labels, batch):
    out, err = evaluate(tmp, scores, labels, batch)
    check(err is None, f"{what}: {err}")
    if err is not None:
        return
    z = scores.double()
    want_logloss = F.binary_cross_entropy_with_logits(z, labels.double()).item()
    want_auc = brute_auc(scores.tolist(), labels.tolist())
    first = out["first"]
    check(out["state_size"] == 3, f"{what}: state size {out['state_size']}")
    check(abs(first.get("auc", -1) - want_auc) <= 1e-12,
          f"{what}: auc {first.get('auc')} vs brute force {want_auc}")
    check(abs(first.get("logloss", -1) - want_logloss) <= 1e-12,
          f"{what}: logloss {first.get('logloss')} vs {want_logloss}")
    pos = float(labels.sum())
    state = out["state"]
    check(state[0] == pos and state[1] == len(labels) - pos and
          abs(state[2] - want_logloss * len(labels)) <= 1e-9, f"{what}: state {state}")
    want_second = brute_auc(scores[:batch].tolist(), labels[:batch].tolist())
    check(abs(out["second"].get("auc", -1) - want_second) <= 1e-12,
          f"{what}: second evaluation auc {out['second'].get('auc')} vs {want_second}")
    print(f"{what}: auc {first['auc']:.12f} (brute force {want_auc:.12f}), logloss "
          f"{first['logloss']:.12f} ({want_logloss:.12f}), second auc "
          f"{out['second']['auc']:.6f} ({want_second:.6f})")


def metric_cases(tmp):
    torch.manual_seed(2)
    # Many ties: 5 distinct scores over 101 samples; batches of 10 (the last one of 1).
    scores = torch.randint(0, 5, (101,)).float() / 2
    labels = (torch.rand(101) < 0.3).float()
    labels[:10] = torch.tensor([1., 0, 0, 1, 0, 0, 0, 1, 0, 0])  # both classes in batch 1
    eval_case(tmp, "auc with ties", scores, labels, 10)
    scores = torch.randn(2000)
    labels = (torch.rand(2000) < torch.sigmoid(2 * scores)).float()
    eval_case(tmp, "auc without ties", scores, labels, 64)

    out, err = evaluate(tmp, torch.randn(20), torch.ones(20), 7)
    check(err is None and "auc" not in out["first"] and "logloss" in out["first"],
          f"all positives: {out} {err}")
    scores = torch.randn(20)
    scores[3] = float("nan")
    out, err = evaluate(tmp, scores, (torch.arange(20) % 2).float(), 7)
    check(err is None and isinstance(out["first"].get("auc"), float) and
          out["first"]["auc"] != out["first"]["auc"], f"NaN score: {out} {err}")
    labels = (torch.arange(20) % 2).float()
    labels[5] = 0.5
    out, err = evaluate(tmp, torch.randn(20), labels, 7)
    check(err is not None and "is not 0 or 1" in err and "\n" not in err,
          f"label 0.5: {out} {err}")


t0 = time.time()
with tempfile.TemporaryDirectory() as tmp:
    bce_cases(tmp)
    metric_cases(tmp)
status = BATCH.close()
check(status == 0, f"probe batch exited with {status}")
print(f"{BATCH.cases} probe cases in {time.time() - t0:.1f} s")
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all ctr checks passed")
