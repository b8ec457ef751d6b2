"""The losses of plugins/losses against PyTorch's F.cross_entropy (python3-torch, the same LibTorch
build), through tests/plugins/lm_losses_probe (the plugin loaded with keel/testing.hpp):

- token_cross_entropy and chunked_cross_entropy on [batch, time, vocab] float32 logits: the loss
  and every element of its gradient within 1e-6 (absolute) of F.cross_entropy's over the
  flattened tokens, without ignore_index and with it (0 and 5 of 21 targets ignored), for chunk
  sizes that divide the token count (1, 7, 21) and that do not (4, 1000); the loss computed
  again under no_grad equals it and does not require grad;
- count and count_items: every target without ignore_index, those not equal to it with it;
  without ignore_index count_items needs no target values (it answers for a meta tensor, which
  has none), with it it reads them (it fails on a meta tensor);
- every target ignored: loss 0 (F.cross_entropy gives NaN), count 0, gradient 0 (as
  F.cross_entropy's), for all three losses;
- without ignore_index a target of -100 is an error pointing at ignore_index;
- cross_entropy's class_dim: -1 on [batch, time, vocab], 1 and -2 on [batch, vocab, time], the
  default on [N, C], all within 1e-6 of F.cross_entropy (loss and gradient);
- a target of the wrong shape: one error line naming both shapes and class_dim; class_dim out of
  range: one line naming it and the output's shape;
- chunked_cross_entropy's compute_linear (ABI 1.5: the loss of features @ weight^T, the output
  layer applied inside the loss a chunk at a time) on float32 features [3, 7, 5] and weight
  [11, 5]: the loss and every element of the gradients of the features and of the weight within
  1e-6 (absolute) of F.cross_entropy(F.linear(features, weight)), for chunk sizes 1, 4, 7, 21
  and 1000, without ignore_index, with 5 of 21 targets ignored, and with all ignored (loss 0,
  zero gradients); the count; the loss again under no_grad equal and not requiring grad;
  token_cross_entropy and cross_entropy offer no compute_linear; features and weight that do
  not fit: one error line naming both shapes;
- memory: the growth of the peak resident set over a loss and its backward on [1, 8192, 4096]
  logits (128 MiB): token_cross_entropy at least 2.5 times the logits' size (its log-softmax
  and two logits-sized gradients in backward), chunked_cross_entropy (chunk_tokens 256) at most
  1.5 times (its gradient buffer and one chunk's float64 temporaries); with the output layer
  (features [1, 8192, 256], weight [4096, 256], the same logits), at::linear then
  token_cross_entropy at least 3 times (the logits themselves too) and compute_linear
  (chunk_tokens 256) at most 0.5 times (the two gradient buffers, 12 MiB, and one chunk's
  logits and temporaries); all printed. Each memory case runs in a process of its own (the
  peak is the process's: earlier cases would have raised it, and memory they freed could be
  reused without growing it), and the batch refuses a memory case. Each first runs the same
  loss and backward on tiny tensors, so that what a process does once on first use (the
  autograd engine's thread, lazily loaded kernels) is not measured: without it the wheel's
  LibTorch 2.11 measured compute_linear at 0.516 times the logits, with it 0.48 to 0.49. Asserted
  only without AddressSanitizer (ASAN_OPTIONS unset): its quarantine keeps freed memory
  resident, so under it the chunked loss's peak measured 3.3 times the logits.

Every other case runs in one `lm_losses_probe --batch` process (tests/plugins/probe.hpp), which saves a
LibTorch start-up per case; an error case gets its message back from it and the batch goes on.
All files are in temporary directories (tempfile), so the test can run beside others.

Usage: test_lm_losses.py PROBE PLUGIN.so
"""
import concurrent.futures
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy
import torch
import torch.nn.functional as F

from probe_batch import Batch

PROBE, PLUGIN = sys.argv[1], sys.argv[2]
TOL = 1e-6
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


BATCH = Batch(PROBE)


def probe(tmp, component, logits, targets, **options):
    lpath, tpath, gpath = (os.path.join(tmp, n) for n in ("l.bin", "t.bin", "g.bin"))
    logits.contiguous().numpy().tofile(lpath)
    targets.contiguous().numpy().tofile(tpath)
    shapes = ",".join(map(str, logits.shape)) + ":" + ",".join(map(str, targets.shape))
    args = [PLUGIN, component, lpath, shapes, tpath, gpath]
    args += [f"{k}={v}" for k, v in options.items()]
    text, err = BATCH.run(*args)
    if err is not None:
        return None, None, err
    out = json.loads(text)
    grad = torch.from_numpy(numpy.fromfile(gpath, dtype="float32")).view(logits.shape)
    return out, grad, None


def probe_mode(mode, component, shape, **options):
    args = [mode, PLUGIN, component, ",".join(map(str, shape))]
    args += [f"{k}={v}" for k, v in options.items()]
    text, err = BATCH.run(*args)
    return (json.loads(text), None) if err is None else (None, err)


def memory_case(mode, component, shape, **options):
    """A memory mode in a process of its own: it measures the process's peak resident set, which
    earlier cases would have raised (and freed memory of theirs could be reused unmeasured)."""
    args = [PROBE, mode, PLUGIN, component, ",".join(map(str, shape))]
    args += [f"{k}={v}" for k, v in options.items()]
    r = subprocess.run(args, capture_output=True, text=True)
    return (json.loads(r.stdout), None) if r.returncode == 0 else (None, r.stderr.strip())


def reference(logits, targets, class_dim=-1, **kw):
    """F.cross_entropy and its gradient with the classes moved to dimension 1."""
    x = logits.clone().requires_grad_(True)
    loss = F.cross_entropy(x.movedim(class_dim, 1) if x.dim() > 2 else x, targets, **kw)
    loss.backward()
    return loss.item(), x.grad


def agrees(what, out, grad, want, want_grad, count):
    loss_diff = abs(out["loss"] - want)
    check(loss_diff <= TOL, f"{what}: loss {out['loss']} vs {want}")
    diff = (grad - want_grad).abs().max().item()
    check(diff <= TOL, f"{what}: max gradient difference {diff}")
    check(out["count"] == count, f"{what}: count {out['count']}, expected {count}")
    check(out["count_items"] == count, f"{what}: count_items {out['count_items']} vs {count}")
    check(out["requires_grad"], f"{what}: the loss does not require grad")
    check(out["no_grad_loss"] == out["loss"] and not out["no_grad_requires_grad"],
          f"{what}: under no_grad {out['no_grad_loss']} (requires grad: "
          f"{out['no_grad_requires_grad']})")
    return loss_diff, diff


# Memory: the growth of the peak RSS over one loss and its backward, on [1, 8192, 4096] logits;
# the last two with the output layer too: features [1, 8192, 256] and weight [4096, 256] (logits
# of the same shape), through at::linear and compute (the logits made whole, as a model's
# forward makes them) and through compute_linear (chunks of 256 rows). Each in a process of its
# own, one at a time, beside the batch of the other cases (read at the end).
shape = (1, 8192, 4096)
growth = {}
MEMORY_CASES = (
    ("token_cross_entropy", "memory", "token_cross_entropy", {}, shape),
    ("chunked_cross_entropy", "memory", "chunked_cross_entropy", {"chunk_tokens": 256}, shape),
    ("memory_plain", "memory_plain", "token_cross_entropy", {}, shape + (256,)),
    ("memory_linear", "memory_linear", "chunked_cross_entropy", {"chunk_tokens": 256},
     shape + (256,)))
memory_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
memory_results = [memory_pool.submit(memory_case, mode, component, sizes, **opts)
                  for _, mode, component, opts, sizes in MEMORY_CASES]

t0 = time.time()
torch.manual_seed(0)
worst = [0.0, 0.0]
with tempfile.TemporaryDirectory() as tmp:
    b, t, v = 3, 7, 11  # 21 tokens
    logits = torch.randn(b, t, v) * 3
    cases = [("token_cross_entropy", {})] + [
        ("chunked_cross_entropy", {"chunk_tokens": c}) for c in (1, 4, 7, 21, 1000)]
    for ignored, ignore in ((0, None), (0, -100), (5, -100)):
        targets = torch.randint(0, v, (b, t))
        if ignored:
            targets.view(-1)[torch.randperm(b * t)[:ignored]] = -100
        kw = {} if ignore is None else {"ignore_index": ignore}
        want, want_grad = reference(logits, targets, **kw)
        for component, opts in cases:
            what = f"{component} {opts} ignore_index={ignore} with {ignored} ignored targets"
            out, grad, err = probe(tmp, component, logits, targets, **opts, **kw)
            if err:
                check(False, f"{what}: {err}")
                continue
            for i, d in enumerate(agrees(what, out, grad, want, want_grad, b * t - ignored)):
                worst[i] = max(worst[i], d)

    # Every target ignored: loss 0, count 0 and PyTorch's gradient (zeros), where PyTorch's
    # mean is NaN.
    targets = torch.full((b, t), -100, dtype=torch.long)
    want, want_grad = reference(logits, targets)
    check(math.isnan(want) and not want_grad.any(), "reference: NaN and a zero gradient")
    for component, opts in (("token_cross_entropy", {}), ("chunked_cross_entropy", {"chunk_tokens": 4}),
                            ("cross_entropy", {"class_dim": -1})):
        out, grad, err = probe(tmp, component, logits, targets, ignore_index=-100, **opts)
        check(err is None and out["loss"] == 0.0 and out["no_grad_loss"] == 0.0 and
              out["count"] == 0 and out["count_items"] == 0 and out["requires_grad"] and
              torch.equal(grad, want_grad),
              f"{component}, every target ignored: {out or err}")

    # Without ignore_index, -100 is a target like any other: out of range, and the error says
    # how to ignore it.
    targets = torch.randint(0, v, (b, t))
    targets[1, 2] = -100
    for component, opts in (("token_cross_entropy", {}), ("chunked_cross_entropy", {"chunk_tokens": 4}),
                            ("cross_entropy", {"class_dim": -1})):
        _, _, err = probe(tmp, component, logits, targets, **opts)
        check(err is not None and "out of range" in err and "-100" in err and
              "set ignore_index" in err and "\n" not in err,
              f"{component}, -100 without ignore_index: {err}")

    # count_items without ignore_index reads no target values (a meta tensor has none).
    for component, shape, opts in (("token_cross_entropy", (4, 16), {}),
                                   ("chunked_cross_entropy", (4, 16), {}),
                                   ("cross_entropy", (4, 16), {"class_dim": -1}),
                                   ("cross_entropy", (64,), {})):
        out, err = probe_mode("count", component, shape, **opts)
        check(err is None and out["count_items"] == 64,
              f"{component} count_items of a meta {shape} target: {out or err}")
        _, err = probe_mode("count", component, shape, ignore_index=-100, **opts)
        check(err is not None and "meta" in err.lower(),
              f"{component} with ignore_index reads the targets (fails on meta): {err}")
    # A memory mode measures the whole process's peak: the batch refuses it.
    _, err = probe_mode("memory", "token_cross_entropy", (1, 2, 3))
    check(err is not None and "fresh process" in err, f"a memory mode in the batch: {err}")

    # cross_entropy's class_dim against F.cross_entropy with the classes in dimension 1.
    targets = torch.randint(0, v, (b, t))
    targets[0, 3] = 5  # ignored below
    moved = logits.transpose(1, 2).contiguous()  # [b, v, t]
    for ignore in (None, 5):
        kw = {} if ignore is None else {"ignore_index": ignore}
        n = b * t - (0 if ignore is None else int((targets == ignore).sum()))
        want, want_grad = reference(logits, targets, **kw)
        for x, class_dim, back in ((logits, -1, lambda g: g), (moved, 1, lambda g: g.transpose(1, 2)),
                                   (moved, -2, lambda g: g.transpose(1, 2))):
            what = f"cross_entropy class_dim={class_dim} on {list(x.shape)} ignore_index={ignore}"
            out, grad, err = probe(tmp, "cross_entropy", x, targets, class_dim=class_dim, **kw)
            if err:
                check(False, f"{what}: {err}")
                continue
            agrees(what, out, back(grad), want, want_grad, n)
    x2, y2 = torch.randn(16, 5), torch.randint(0, 5, (16,))
    want, want_grad = reference(x2, y2)
    out, grad, err = probe(tmp, "cross_entropy", x2, y2)
    if err:
        check(False, f"cross_entropy on [16, 5]: {err}")
    else:
        agrees("cross_entropy (default class_dim) on [16, 5]", out, grad, want, want_grad, 16)

    # Shape mismatches: one line naming both shapes and class_dim.
    _, _, err = probe(tmp, "token_cross_entropy", logits, torch.zeros(b, t - 1, dtype=torch.long))
    check(err is not None and "model output [3, 7, 11] and target [3, 6] do not match: with "
          "class_dim = -1 the target must be [3, 7]" in err and "\n" not in err,
          f"token shape mismatch: {err}")
    _, _, err = probe(tmp, "chunked_cross_entropy", logits, torch.zeros(b, t - 1, dtype=torch.long))
    check(err is not None and "model output [3, 7, 11] and target [3, 6]" in err and
          "\n" not in err, f"chunked shape mismatch: {err}")
    _, _, err = probe(tmp, "cross_entropy", logits, torch.zeros(b, t - 1, dtype=torch.long),
                      class_dim=-1)
    check(err is not None and "model output [3, 7, 11] and target [3, 6] do not match: with "
          "class_dim = -1 the target must be [3, 7]" in err and "\n" not in err,
          f"cross_entropy class_dim=-1 shape mismatch: {err}")
    _, _, err = probe(tmp, "cross_entropy", logits, torch.zeros(b, t, dtype=torch.long))
    check(err is not None and "with class_dim = 1 the target must be [3, 11]" in err,
          f"cross_entropy default class_dim on [b, t, v]: {err}")
    for class_dim in (3, -4):
        _, _, err = probe(tmp, "cross_entropy", logits, targets, class_dim=class_dim)
        check(err is not None and f"class_dim = {class_dim} is out of range for a model output "
              "of shape [3, 7, 11]" in err and "\n" not in err, f"class_dim {class_dim}: {err}")

print(f"largest differences from F.cross_entropy (token losses): loss {worst[0]:.2e}, "
      f"gradient {worst[1]:.2e} (tolerance {TOL:g})")


def probe_linear(tmp, component, features, weight, targets, **options):
    """compute_linear through the probe: (JSON, d/dfeatures, d/dweight) or (None, None, error)."""
    paths = [os.path.join(tmp, n) for n in ("f.bin", "w.bin", "t.bin", "g.bin")]
    for x, path in zip((features, weight, targets), paths):
        x.contiguous().numpy().tofile(path)
    args = ["linear", PLUGIN, component, paths[0], ",".join(map(str, features.shape)),
            paths[1], ",".join(map(str, weight.shape)), paths[2], paths[3]]
    args += [f"{k}={v}" for k, v in options.items()]
    text, err = BATCH.run(*args)
    if err is not None:
        return None, None, err
    grads = torch.from_numpy(numpy.fromfile(paths[3], dtype="float32"))
    n = features.numel()
    return json.loads(text), grads[:n].view(features.shape), grads[n:].view(weight.shape)


# chunked_cross_entropy's compute_linear (the output layer inside the loss) against
# F.cross_entropy(F.linear(features, weight)): the loss, and the gradients of the features and
# the weight.
worst_linear = [0.0, 0.0]
with tempfile.TemporaryDirectory() as tmp:
    b, t, f, v = 3, 7, 5, 11
    features = torch.randn(b, t, f) * 2
    weight = torch.randn(v, f)
    for ignored, ignore in ((0, None), (5, -100), (b * t, -100)):
        targets = torch.randint(0, v, (b, t))
        if ignored:
            targets.view(-1)[torch.randperm(b * t)[:ignored]] = -100
        kw = {} if ignore is None else {"ignore_index": ignore}
        x, w = features.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        ref = F.cross_entropy(F.linear(x, w).reshape(-1, v), targets.reshape(-1), **kw)
        if ignored == b * t:
            ref = (F.linear(x, w).sum() * 0)  # keel's losses: 0 and a zero gradient, not NaN
        ref.backward()
        for chunk in (1, 4, 7, 21, 1000):
            what = f"compute_linear chunk_tokens={chunk} ignore_index={ignore}, {ignored} ignored"
            out, gf, gw = probe_linear(tmp, "chunked_cross_entropy", features, weight, targets,
                                       chunk_tokens=chunk, **kw)
            if out is None:
                check(False, f"{what}: {gw}")
                continue
            dl = abs(out["loss"] - ref.item())
            dg = max((gf - x.grad).abs().max().item(), (gw - w.grad).abs().max().item())
            worst_linear = [max(worst_linear[0], dl), max(worst_linear[1], dg)]
            check(dl <= TOL and dg <= TOL,
                  f"{what}: loss {out['loss']} vs {ref.item()}, gradient difference {dg}")
            check(out["count"] == b * t - ignored and out["requires_grad"] and
                  out["no_grad_loss"] == out["loss"] and not out["no_grad_requires_grad"],
                  f"{what}: {out}")
    # Only chunked_cross_entropy offers compute_linear (the kernel then uses it in training).
    for component in ("token_cross_entropy", "cross_entropy"):
        _, _, err = probe_linear(tmp, component, features, weight, torch.zeros(b, t, dtype=torch.long))
        check(err == "no compute_linear", f"{component} has compute_linear: {err}")
    # Shapes: features and weight that do not fit, and a target that does not fit the output.
    _, _, err = probe_linear(tmp, "chunked_cross_entropy", features, torch.randn(v, f + 1),
                             torch.zeros(b, t, dtype=torch.long))
    check(err is not None and "model features [3, 7, 5] and output weight [11, 6] are not "
          "[batch, time, F] and [vocab, F]" in err and "\n" not in err, f"weight shape: {err}")
print(f"largest differences from F.cross_entropy(F.linear(...)) (compute_linear): loss "
      f"{worst_linear[0]:.2e}, gradients {worst_linear[1]:.2e} (tolerance {TOL:g})")
cases, status = BATCH.cases, BATCH.close()
check(status == 0, f"lm_losses_probe --batch exited with status {status}")
print(f"{cases} cases in one lm_losses_probe process; the {len(MEMORY_CASES)} memory cases in "
      "one each")

for (key, mode, component, opts, sizes), future in zip(MEMORY_CASES, memory_results):
    out, err = future.result()
    if err:
        check(False, f"{mode} {component}: {err}")
        continue
    growth[key] = out["peak_growth_bytes"] / out["logits_bytes"]
    print(f"{mode} {component} {opts} B,T,V[,F] = {list(sizes)}: peak RSS grows by "
          f"{out['peak_growth_bytes'] / 2**20:.0f} MiB = {growth[key]:.2f} x the logits "
          f"({out['logits_bytes'] / 2**20:.0f} MiB)")
if "ASAN_OPTIONS" in os.environ:
    print("memory bounds not asserted: under AddressSanitizer freed memory stays resident")
elif len(growth) == 4:
    check(growth["token_cross_entropy"] >= 2.5, f"token_cross_entropy grows {growth}")
    check(growth["chunked_cross_entropy"] <= 1.5, f"chunked_cross_entropy grows {growth}")
    check(growth["memory_plain"] >= 3.0, f"linear + token_cross_entropy grows {growth}")
    check(growth["memory_linear"] <= 0.5, f"compute_linear grows {growth}")

print(f"{len(failures)} failure(s) in {time.time() - t0:.1f} s")
sys.exit(1 if failures else 0)
