"""The language-model losses of plugins/losses against PyTorch's F.cross_entropy (python3-torch,
the same LibTorch build), through tests/lm_losses_probe (the plugin loaded with keel/testing.hpp):

- token_cross_entropy and chunked_cross_entropy on [batch, time, vocab] float32 logits: the loss
  and every element of its gradient within 1e-6 (absolute) of F.cross_entropy's over the
  flattened tokens, with and without ignored targets, for chunk sizes that divide the token
  count and that do not (chunked computes in float64, F.cross_entropy in float32);
- every target ignored: NaN, as F.cross_entropy's mean gives;
- count and count_items: the tokens not equal to ignore_index;
- cross_entropy with class_dim = -1 on [batch, time, vocab] equals token_cross_entropy, and with
  class_dim = 1 on [batch, vocab, time] too (the same logits, moved);
- a target of the wrong shape: one error line naming both shapes and class_dim.

Usage: test_lm_losses.py PROBE PLUGIN.so
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

PROBE, PLUGIN = sys.argv[1], sys.argv[2]
TOL = 1e-6
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def probe(tmp, component, logits, targets, **options):
    lpath, tpath, gpath = (os.path.join(tmp, n) for n in ("l.bin", "t.bin", "g.bin"))
    logits.contiguous().numpy().tofile(lpath)
    targets.contiguous().numpy().tofile(tpath)
    shapes = ",".join(map(str, logits.shape)) + ":" + ",".join(map(str, targets.shape))
    args = [PROBE, PLUGIN, component, lpath, shapes, tpath, gpath]
    args += [f"{k}={v}" for k, v in options.items()]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        return None, None, r.stderr.strip()
    out = json.loads(r.stdout)
    grad = torch.from_numpy(__import__("numpy").fromfile(gpath, dtype="float32")).view(logits.shape)
    return out, grad, None


def reference(logits, targets, ignore_index=-100):
    x = logits.clone().requires_grad_(True)
    loss = F.cross_entropy(x.view(-1, x.size(-1)), targets.view(-1), ignore_index=ignore_index)
    loss.backward()
    return loss.item(), x.grad


torch.manual_seed(0)
with tempfile.TemporaryDirectory() as tmp:
    b, t, v = 3, 7, 11  # 21 tokens
    logits = torch.randn(b, t, v) * 3
    for ignored in (0, 5):
        targets = torch.randint(0, v, (b, t))
        if ignored:
            targets.view(-1)[torch.randperm(b * t)[:ignored]] = -100
        want, want_grad = reference(logits, targets)
        cases = [("token_cross_entropy", {})] + [
            ("chunked_cross_entropy", {"chunk_tokens": c}) for c in (1, 4, 7, 21, 1000)]
        for component, opts in cases:
            what = f"{component} {opts} with {ignored} ignored targets"
            out, grad, err = probe(tmp, component, logits, targets, **opts)
            if err:
                check(False, f"{what}: {err}")
                continue
            check(abs(out["loss"] - want) <= TOL, f"{what}: loss {out['loss']} vs {want}")
            diff = (grad - want_grad).abs().max().item()
            check(diff <= TOL, f"{what}: max gradient difference {diff}")
            check(out["count"] == b * t - ignored, f"{what}: count {out['count']}")
            check(out["count_items"] == b * t - ignored, f"{what}: count_items {out['count_items']}")

    # Every target ignored: NaN (F.cross_entropy's mean of nothing).
    targets = torch.full((b, t), -100, dtype=torch.long)
    check(math.isnan(reference(logits, targets)[0]), "reference NaN")
    for component in ("token_cross_entropy", "chunked_cross_entropy"):
        out, _, err = probe(tmp, component, logits, targets)
        check(err is None and math.isnan(out["loss"]) and out["count"] == 0,
              f"{component}, every target ignored: {out or err}")

    # cross_entropy's class_dim: the same value as token_cross_entropy.
    targets = torch.randint(0, v, (b, t))
    want, want_grad = reference(logits, targets)
    out, grad, err = probe(tmp, "cross_entropy", logits, targets, class_dim=-1)
    check(err is None and abs(out["loss"] - want) <= TOL and (grad - want_grad).abs().max() <= TOL,
          f"cross_entropy class_dim=-1: {out or err}")
    moved = logits.transpose(1, 2).contiguous()  # [b, v, t]
    out, grad, err = probe(tmp, "cross_entropy", moved, targets, class_dim=1)
    check(err is None and abs(out["loss"] - want) <= TOL and
          (grad.transpose(1, 2) - want_grad).abs().max() <= TOL,
          f"cross_entropy class_dim=1 on [b, v, t]: {out or err}")

    # Shape mismatches: one line naming both shapes.
    _, _, err = probe(tmp, "token_cross_entropy", logits, torch.zeros(b, t - 1, dtype=torch.long))
    check(err is not None and "model output [3, 7, 11] and target [3, 6]" in err and
          "must be [3, 7]" in err and "\n" not in err, f"token shape mismatch: {err}")
    _, _, err = probe(tmp, "cross_entropy", logits, torch.zeros(b, t, dtype=torch.long))
    check(err is not None and "with class_dim = 1 the target must be [3, 11]" in err,
          f"cross_entropy default class_dim on [b, t, v]: {err}")
    _, _, err = probe(tmp, "cross_entropy", logits, targets, class_dim=3)
    check(err is not None and "class_dim = 3 is out of range" in err, f"class_dim 3: {err}")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
