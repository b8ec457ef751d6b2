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

model dlrm (one training forward and backward of sum(logits * coef), then end_step and one
evaluation forward), against a float64 PyTorch reference built from the model's own parameters
and the rows its tables looked up (F.linear + relu for the MLPs, F.embedding_bag with the rows
for the embeddings, padding_idx for missing and unknown ids, bmm + tril_indices for "dot"):
- options tables (per_feature, shared), interaction (dot, cat), pooling (sum, mean), empty
  bottom and top MLPs, embedding_dim 3 to 16, B = 32 with missing (-1) and repeated ids:
  logits [B] float32 within 1e-5 (absolute) of the reference, every parameter's gradient and
  every touched row's gradient (the table's `touched`, duplicates merged) within 1e-5 times
  max(1, the largest reference gradient); tables named C1 .. C26 (or one, `categorical`), each
  touching exactly its distinct ids >= 0; evaluation logits on other rows (half of the ids
  unseen: zeros) within 1e-5; flops_per_sample = 6 x (the Linear layers' in x out + 27 x 27 x
  embedding_dim for dot);
- min_count = 2 with every id seen once: no row touched, logits as with zero embeddings;
  init_std = 0.5: the rows' standard deviation within 10% of 0.5;
- interaction dot with bottom_mlp ending at another width than embedding_dim: one error line;
- the same four option sets on named batches (forward_batch, keel.model.batch/1) of multi-hot,
  ragged bags: dense [24, 13], sparse_ids [24, 80] padded with -1, sparse_offsets [24, 27],
  0 to 3 ids per bag (empty bags, some -1), against the reference's F.embedding_bag over each
  table's bags (an id without a row counted by a mean as a zero row, keel/embedding.hpp):
  the same bounds; offsets that go back within a sample: one error line naming the entry.
embedding table alone (multi-id bags, which Criteo's single-valued fields never make): 40 ids
(some -1, repeats) in 12 bags (two empty) of dim 5, sum and mean, against F.embedding_bag over
the touched rows: pooled values within 1e-6, row gradients within 1e-6; the evaluation lookup
equal.

- several ranks: 203 scores with ties split over 2 and 3 ranks (instances created with a fake
  keel_comm whose all_gather concatenates the ranks' rows, each rank's metric_finish on a
  thread of its own, the states summed as the kernel sums them): every rank reports the same
  `auc`, within 1e-12 of brute force over all 203, and `logloss` within 1e-12.
The kernel's own keel_comm (Gloo) under bce is left to end-to-end runs.

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
    scores = torch.randint(0, 9, (203,)).float() / 4
    labels = (torch.rand(203) < 0.4).float()
    write(os.path.join(tmp, "scores.bin"), scores)
    write(os.path.join(tmp, "labels.bin"), labels)
    want_auc = brute_auc(scores.tolist(), labels.tolist())
    want_logloss = F.binary_cross_entropy_with_logits(scores.double(), labels.double()).item()
    for world in (2, 3):
        text, err = BATCH.run("bce_ranks", PLUGIN, tmp, 203, world)
        check(err is None, f"{world} ranks: {err}")
        if err is not None:
            continue
        ranks = json.loads(text)["ranks"]
        check(len(ranks) == world and all(r == ranks[0] for r in ranks),
              f"{world} ranks: the ranks disagree: {ranks}")
        got = ranks[0]
        check(abs(got.get("auc", -1) - want_auc) <= 1e-12 and
              abs(got.get("logloss", -1) - want_logloss) <= 1e-12,
              f"{world} ranks: {got} vs auc {want_auc}, logloss {want_logloss}")
        print(f"{world} ranks: auc {got['auc']:.12f} (brute force {want_auc:.12f})")
    labels = (torch.arange(20) % 2).float()
    labels[5] = 0.5
    out, err = evaluate(tmp, torch.randn(20), labels, 7)
    check(err is not None and "is not 0 or 1" in err and "\n" not in err,
          f"label 0.5: {out} {err}")


def table_weight(tmp, t, dim):
    """The rows table t touched: {id: row index + 1} and a float64 weight [1 + n, dim] whose row
    0 is the zero row (padding) for missing and unknown ids."""
    ids = numpy.fromfile(os.path.join(tmp, f"t{t}_ids.bin"), dtype="int64")
    values = read(os.path.join(tmp, f"t{t}_values.bin"), "float32", (len(ids), dim))
    grads = read(os.path.join(tmp, f"t{t}_grads.bin"), "float32", (len(ids), dim))
    index = {int(i): k + 1 for k, i in enumerate(ids)}
    weight = torch.cat([torch.zeros(1, dim, dtype=torch.float64), values.double()])
    return index, weight.requires_grad_(True), grads


def lookup(index, ids):
    return torch.tensor([index.get(int(i), 0) if i >= 0 else 0 for i in ids.reshape(-1)],
                        dtype=torch.long)


def bag_embeddings(ids, offsets, sid, tables, opts):
    """The pooled rows [B, 26, dim] of multi-hot bags: sample s's bag of feature f is
    ids[s, offsets[s, f]:offsets[s, f + 1]] (sid: the same positions' shared-table ids). A
    missing id (-1) is left out (padding_idx), an id >= 0 without a row is a zero row that a
    mean counts (keel/embedding.hpp, kMean)."""
    b, dim, mode = ids.shape[0], opts["embedding_dim"], opts.get("pooling", "sum")
    shared = opts.get("tables", "per_feature") == "shared"
    flat = [[] for _ in range(1 if shared else 26)]
    starts = [[] for _ in flat]
    for s in range(b):
        for f in range(26):
            t = 0 if shared else f
            starts[t].append(len(flat[t]))
            bag = range(int(offsets[s, f]), int(offsets[s, f + 1]))
            flat[t] += [int(sid[s, k]) if shared else int(ids[s, k]) for k in bag]
    pooled = []
    for t in range(len(flat)):
        index, weight = tables[t]
        zero = weight.shape[0]  # the index of the zero row appended below
        idx = torch.tensor([index.get(i, zero) if i >= 0 else 0 for i in flat[t]],
                           dtype=torch.long)
        weight = torch.cat([weight, torch.zeros(1, dim, dtype=weight.dtype)])
        pooled.append(F.embedding_bag(idx, weight, torch.tensor(starts[t]), mode=mode,
                                      padding_idx=0))
    return pooled[0].view(b, 26, dim) if shared else torch.stack(pooled, 1)


def reference(inputs, sid, params, tables, opts, bags=None):
    """The float64 logits of dlrm from its parameters (name -> tensor) and its tables' rows:
    on the columns `inputs`, or with bags = (dense, ids, offsets) on a named batch."""
    b = inputs.shape[0] if bags is None else bags[0].shape[0]
    dim = opts["embedding_dim"]
    mode = opts.get("pooling", "sum")
    x = (inputs[:, :13] if bags is None else bags[0]).float().double()
    i = 0
    while f"bottom{i}.weight" in params:
        x = torch.relu(F.linear(x, params[f"bottom{i}.weight"], params[f"bottom{i}.bias"]))
        i += 1
    if bags is not None:
        e = bag_embeddings(bags[1], bags[2], sid, tables, opts)
    elif opts.get("tables", "per_feature") == "shared":
        index, weight = tables[0]
        idx = lookup(index, sid)
        e = F.embedding_bag(idx, weight, torch.arange(b * 26), mode=mode, padding_idx=0)
        e = e.view(b, 26, dim)
    else:
        ids = inputs[:, 13:].long()
        e = torch.stack([F.embedding_bag(lookup(tables[f][0], ids[:, f]), tables[f][1],
                                         torch.arange(b), mode=mode, padding_idx=0)
                         for f in range(26)], 1)
    if opts.get("interaction", "dot") == "dot":
        v = torch.cat([x.unsqueeze(1), e], 1)
        li, lj = torch.tril_indices(27, 27, offset=-1)
        z = torch.cat([x, torch.bmm(v, v.transpose(1, 2))[:, li, lj]], 1)
    else:
        z = torch.cat([x, e.flatten(1)], 1)
    i = 0
    while f"top{i}.weight" in params:
        z = torch.relu(F.linear(z, params[f"top{i}.weight"], params[f"top{i}.bias"]))
        i += 1
    return F.linear(z, params["out.weight"], params["out.bias"]).reshape(-1)


def make_inputs(b, cardinality, missing, gen):
    numeric = torch.rand(b, 13, generator=gen, dtype=torch.float64) * 5
    ids = torch.randint(0, cardinality, (b, 26), generator=gen) * 7919 + 11
    ids[torch.rand(b, 26, generator=gen) < missing] = -1
    return torch.cat([numeric, ids.double()], 1)


# The sparse_ids width of named batches: up to 3 ids per bag, and 2 more columns of padding.
BAG_WIDTH = 26 * 3 + 2


def make_bags(b, cardinality, missing, gen):
    """A named batch: dense float32 [b, 13], sparse_ids int64 [b, BAG_WIDTH] (padded with -1)
    and sparse_offsets int64 [b, 27]: 0 to 3 ids per bag (empty bags too), some -1."""
    dense = torch.rand(b, 13, generator=gen) * 5
    lengths = torch.randint(0, 4, (b, 26), generator=gen)
    ids = torch.full((b, BAG_WIDTH), -1, dtype=torch.long)
    offsets = torch.zeros(b, 27, dtype=torch.long)
    for s in range(b):
        at = 0
        for f in range(26):
            offsets[s, f] = at
            n = int(lengths[s, f])
            values = torch.randint(0, cardinality, (n,), generator=gen) * 7919 + 11
            values[torch.rand(n, generator=gen) < missing] = -1
            ids[s, at:at + n] = values
            at += n
        offsets[s, 26] = at
    return dense, ids, offsets


def run_dlrm_named(tmp, b, opts):
    gen = torch.Generator().manual_seed(6)
    bags, bags2 = make_bags(b, 12, 0.1, gen), make_bags(b, 24, 0.1, gen)
    coef = torch.randn(b, generator=gen)
    for suffix, (dense, ids, offsets) in (("", bags), ("2", bags2)):
        write(os.path.join(tmp, f"dense{suffix}.bin"), dense)
        write(os.path.join(tmp, f"ids{suffix}.bin"), ids)
        write(os.path.join(tmp, f"offsets{suffix}.bin"), offsets)
    write(os.path.join(tmp, "coef.bin"), coef)
    text, err = BATCH.run("dlrm_named", PLUGIN, tmp, b, b, BAG_WIDTH,
                          *[f"{k}={v}" for k, v in opts.items()])
    return (bags, bags2, coef, json.loads(text), None) if err is None else (
        None, None, None, None, err)


def run_dlrm(tmp, b, opts, unique=False):
    gen = torch.Generator().manual_seed(5)
    inputs = make_inputs(b, 10 ** 6 if unique else 12, 0.1, gen)
    inputs2 = make_inputs(b, 24, 0.1, gen)  # about half of the ids unseen in training
    coef = torch.randn(b, generator=gen)
    write(os.path.join(tmp, "inputs.bin"), inputs)
    write(os.path.join(tmp, "inputs2.bin"), inputs2)
    write(os.path.join(tmp, "coef.bin"), coef)
    text, err = BATCH.run("dlrm", PLUGIN, tmp, b, b, *[f"{k}={v}" for k, v in opts.items()])
    return (inputs, inputs2, coef, json.loads(text), None) if err is None else (
        None, None, None, None, err)


def flops_of(out, opts):
    macs = sum(p["shape"][0] * p["shape"][1] for p in out["params"] if p["name"].endswith("weight"))
    if opts.get("interaction", "dot") == "dot":
        macs += 27 * 27 * opts["embedding_dim"]
    return 6.0 * macs


def dlrm_case(tmp, what, opts, b=32, named=False):
    """named: a named batch of multi-hot bags (make_bags) through forward_batch."""
    inputs, inputs2, coef, out, err = (run_dlrm_named if named else run_dlrm)(tmp, b, opts)
    check(err is None, f"{what}: {err}")
    if err is not None:
        return
    dim = opts["embedding_dim"]
    shared = opts.get("tables", "per_feature") == "shared"
    names = [t["name"] for t in out["tables"]]
    check(names == (["categorical"] if shared else [f"C{f + 1}" for f in range(26)]),
          f"{what}: tables {names}")
    check(out["output_shape"] == [b] and out["output_dtype"] == "Float",
          f"{what}: output {out['output_shape']} {out['output_dtype']}")
    params, grads = {}, {}
    for i, p in enumerate(out["params"]):
        params[p["name"]] = read(os.path.join(tmp, f"p{i}.bin"), "float32",
                                 p["shape"]).double().requires_grad_(True)
        grads[p["name"]] = read(os.path.join(tmp, f"g{i}.bin"), "float32", p["shape"])
    tables, table_grads = [], []
    for t in range(len(names)):
        index, weight, g = table_weight(tmp, t, dim)
        tables.append((index, weight))
        table_grads.append(g)
    width = BAG_WIDTH if named else 26
    sid = numpy.fromfile(os.path.join(tmp, "sid.bin"), dtype="int64").reshape(b, width)
    sid2 = numpy.fromfile(os.path.join(tmp, "sid2.bin"), dtype="int64").reshape(b, width)
    # Each table touched exactly its distinct ids >= 0.
    ids = None if named else inputs[:, 13:].long().numpy()
    for t in range(len(names)):
        if named:  # the ids in feature t's bags
            col = sid if shared else numpy.array(
                [int(inputs[1][s, k]) for s in range(b)
                 for k in range(int(inputs[2][s, t]), int(inputs[2][s, t + 1]))], dtype="int64")
        else:
            col = sid if shared else ids[:, t]
        want = {int(i) for i in col.reshape(-1) if i >= 0}
        check(set(tables[t][0]) == want and out["tables"][t]["touched"] == len(want),
              f"{what}: table {names[t]} touched {out['tables'][t]['touched']} rows, "
              f"{len(want)} distinct ids")
    logits = read(os.path.join(tmp, "logits.bin"), "float32", (b,))
    want = (reference(None, sid, params, tables, opts, bags=inputs) if named
            else reference(inputs, sid, params, tables, opts))
    (want * coef.double()).sum().backward()
    diff = (logits.double() - want).abs().max().item()
    check(diff <= 1e-5, f"{what}: max logit difference {diff}")
    worst = 0.0
    for name, g in grads.items():
        ref = params[name].grad
        d = (g.double() - ref).abs().max().item() / max(1.0, ref.abs().max().item())
        worst = max(worst, d)
        check(d <= 1e-5, f"{what}: gradient of {name} differs by {d} (relative)")
    for t, g in enumerate(table_grads):
        ref = tables[t][1].grad[1:]
        d = 0.0
        if len(g):
            d = (g.double() - ref).abs().max().item() / max(1.0, ref.abs().max().item())
        worst = max(worst, d)
        check(d <= 1e-5, f"{what}: row gradients of table {names[t]} differ by {d} (relative)")
    with torch.no_grad():
        want2 = (reference(None, sid2, params, tables, opts, bags=inputs2) if named
                 else reference(inputs2, sid2, params, tables, opts))
    eval_logits = read(os.path.join(tmp, "eval_logits.bin"), "float32", (b,))
    diff2 = (eval_logits.double() - want2).abs().max().item()
    check(diff2 <= 1e-5, f"{what}: max evaluation logit difference {diff2}")
    want_flops = flops_of(out, opts)
    check(out["flops"] == want_flops, f"{what}: flops {out['flops']} vs {want_flops}")
    print(f"{what}: logits within {diff:.1e}, gradients within {worst:.1e} (relative), "
          f"evaluation within {diff2:.1e}; {sum(t['touched'] for t in out['tables'])} rows")


DLRM_CASES = [
    ("dlrm defaults", {"embedding_dim": 16}),
    ("dlrm cat shared mean", {"embedding_dim": 8, "bottom_mlp": "[32]", "top_mlp": "[16]",
                              "interaction": "cat", "tables": "shared", "pooling": "mean"}),
    ("dlrm dot shared no top", {"embedding_dim": 4, "bottom_mlp": "[8, 4]", "top_mlp": "[]",
                                "tables": "shared"}),
    ("dlrm cat no bottom", {"embedding_dim": 3, "bottom_mlp": "[]", "top_mlp": "[8, 8]",
                            "interaction": "cat", "pooling": "mean"}),
]


def dlrm_cases(tmp):
    for what, opts in DLRM_CASES:
        dlrm_case(tmp, what, opts)
    for what, opts in DLRM_CASES:  # named batches, multi-hot bags
        dlrm_case(tmp, what.replace("dlrm", "dlrm multi-hot"), opts, b=24, named=True)
    # Offsets that go back within a sample: one error line naming the entry.
    _, _, _, _, err = run_dlrm_named(tmp, 4, {"embedding_dim": 16})
    offsets = torch.arange(27).repeat(4, 1)
    offsets[2, 5] = 2
    write(os.path.join(tmp, "offsets.bin"), offsets)
    _, err = BATCH.run("dlrm_named", PLUGIN, tmp, 4, 4, BAG_WIDTH, "embedding_dim=16")
    check(err is not None and "sparse_offsets[2, 5] = 2" in err and "\n" not in err,
          f"decreasing sparse_offsets: {err}")
    # min_count 2, every id seen once: no rows, zero embeddings.
    opts = {"embedding_dim": 16, "min_count": 2}
    inputs, _, _, out, err = run_dlrm(tmp, 16, opts, unique=True)
    check(err is None and all(t["touched"] == 0 and t["rows"] == 0 for t in out["tables"]),
          f"min_count 2: {err or out['tables'][:2]}")
    if err is None:
        params = {p["name"]: read(os.path.join(tmp, f"p{i}.bin"), "float32", p["shape"]).double()
                  for i, p in enumerate(out["params"])}
        zero = [({}, torch.zeros(1, 16, dtype=torch.float64)) for _ in range(26)]
        want = reference(inputs, None, params, zero, opts)
        diff = (read(os.path.join(tmp, "logits.bin"), "float32", (16,)).double() - want).abs().max()
        check(diff <= 1e-5, f"min_count 2: logits differ from zero embeddings by {diff}")
    inputs, _, _, out, err = run_dlrm(tmp, 32, {"embedding_dim": 16, "init_std": 0.5})
    check(err is None, f"init_std: {err}")
    if err is None:
        values = torch.cat([table_weight(tmp, t, 16)[1][1:].detach() for t in range(26)])
        std = values.std().item()
        check(abs(std - 0.5) <= 0.05, f"init_std 0.5: rows' std {std}")
        print(f"init_std 0.5: {values.shape[0]} rows, std {std:.4f}")
    _, _, _, out, err = run_dlrm(tmp, 4, {"embedding_dim": 8, "bottom_mlp": "[16]"})
    check(err is not None and "embedding_dim" in err and "bottom_mlp" in err and "\n" not in err,
          f"dot with a bottom width other than embedding_dim: {err}")


def pool_cases(tmp):
    gen = torch.Generator().manual_seed(9)
    n, bags, dim = 40, 12, 5
    ids = torch.randint(0, 9, (n,), generator=gen) * 1000003
    ids[torch.rand(n, generator=gen) < 0.2] = -1
    offsets = torch.tensor([0, 3, 3, 7, 12, 13, 20, 20, 26, 30, 33, 38])  # bags 1 and 6 empty
    coef = torch.randn(bags, dim, generator=gen)
    write(os.path.join(tmp, "ids.bin"), ids)
    write(os.path.join(tmp, "offsets.bin"), offsets)
    write(os.path.join(tmp, "coef.bin"), coef)
    for mode in ("sum", "mean"):
        text, err = BATCH.run("pool", tmp, n, bags, dim, mode)
        check(err is None, f"pool {mode}: {err}")
        if err is not None:
            continue
        index, weight, grads = table_weight(tmp, 0, dim)
        check(set(index) == {int(i) for i in ids if i >= 0}, f"pool {mode}: touched {set(index)}")
        want = F.embedding_bag(lookup(index, ids), weight, offsets, mode=mode, padding_idx=0)
        (want * coef.double()).sum().backward()
        got = read(os.path.join(tmp, "out.bin"), "float32", (bags, dim)).double()
        again = read(os.path.join(tmp, "out_eval.bin"), "float32", (bags, dim)).double()
        diff = (got - want).abs().max().item()
        gdiff = (grads.double() - weight.grad[1:]).abs().max().item()
        check(diff <= 1e-6 and gdiff <= 1e-6, f"pool {mode}: values {diff}, gradients {gdiff}")
        check(torch.equal(got, again), f"pool {mode}: the evaluation lookup differs")
        print(f"pool {mode}: values within {diff:.1e}, row gradients within {gdiff:.1e}")


t0 = time.time()
with tempfile.TemporaryDirectory() as tmp:
    bce_cases(tmp)
    metric_cases(tmp)
    dlrm_cases(tmp)
    pool_cases(tmp)
status = BATCH.close()
check(status == 0, f"probe batch exited with {status}")
print(f"{BATCH.cases} probe cases in {time.time() - t0:.1f} s")
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all ctr checks passed")
