"""Sparse embedding tables in the loop (ABI 1.9): the fixture model `table_model`
(tests/fixtures/sparse_table.cpp, a table written against the C ABI) with the
[sparse_optimizer]s of plugins/sparse_optimizers. The fixture appends its rows (values, slots and
the step's gradients) to a dump file at every end_step; the cases read it:

- the sparse optimizers' math against torch.optim.Adagrad / AdamW (same LibTorch, replayed on the
  dumped gradients; rows touched in every step for AdamW), with a step-decay [lr_scheduler], so
  that the schedule reaching set_lr is checked too: rtol 1e-5, atol 1e-7 (float32 rounding);
  each case twice, the table handing host pointers and handing tensors (the fixture's
  `as_tensors`, ABI 1.11: the optimizers' tensor form, update_tensors);
- a step with a NaN row gradient: skipped (rows and slots as before it), or the run fails;
- grad_accum = 2 micro-batches of 4 give the row gradients of one batch of 8 (atol 1e-7);
- the train records' table_rows, admitted, evicted and sparse_grad_norm (with ttl eviction);
- checkpoint + --resume: the rows and slots after it equal an uninterrupted run's, bit for bit;
- resume at another number of ranks (2 -> 1, 1 -> 2, torchrun): the parts each rank loads;
- [checkpoint] init_from loads the tables;
- a handed checkpoint whose record (checksums redone) claims table entries of [2^62, 4], of 8 TiB
  or an index of 3e9 rows over a file that holds a few: one error line naming commit.json and
  the entry, exit 1 (issue 43, finding 9: "internal error", exit 70, before);
- the one-line errors of a model with tables but no [sparse_optimizer], and the reverse;
- a sparse optimizer built against the frozen ABI 1.10 header (tests/fixtures/abi_1_10.c,
  w -= lr * g through keel_sparse_rows' host pointers) trains the fixture table, which hands
  host pointers: each dumped row after its first step is its initial row - lr * gradient
  (atol 1e-7).

Usage: test_sparse.py KEEL_BINARY FIXTURE_DIR (with the Python of the LibTorch keel links:
meson.build's torch_python)."""
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

from handed import recommit
from launching import TORCHRUN, free_port

KEEL, FIXTURES = sys.argv[1], os.path.abspath(sys.argv[2])

BASE = """
[run]
name = "sparse"
seed = 3
threads = 1
[plugins]
paths = ["{fixtures}"]
[train]
max_steps = {steps}
log_every = 1
[model]
type = "table_model"
dim = 4
dump = "{dump}"
[data.train]
type = "id_batches"
batch_size = 4
batches = 8
ids = 2
vocab = {vocab}
[optimizer]
type = "sgd"
lr = 0.1
[sparse_optimizer]
type = "{sparse}"
lr = 0.5
[loss]
type = "cross_entropy"
[[hooks]]
type = "jsonl"
"""


def keel(*args, ok=True):
    r = subprocess.run([KEEL, *args], capture_output=True, text=True, timeout=300)
    if ok and r.returncode != 0:
        raise AssertionError(f"keel {' '.join(args)} exited {r.returncode}:\n{r.stderr}")
    return r


def read_dump(path):
    """{step: {id: (values, slots, grads)}} from the fixture's dump file."""
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts[0] == "load":
                continue
            rows = {}
            for p in parts[1:]:
                rid, rest = p.split(":")
                fields = [[float(x) for x in s.split(",")] if s else [] for s in rest.split("|")]
                rows[int(rid)] = tuple(fields)
            out[int(parts[0])] = rows
    return out


def load_lines(path):
    """The fixture's "load <rows in the part> <rows kept>" lines, split."""
    with open(path) as f:
        return [l.split() for l in f if l.startswith("load")]


def train_records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r.get("split") == "train"]


def initial_row(rid, dim=4):
    return torch.tensor([0.1 * math.sin(rid * (d + 1)) for d in range(dim)], dtype=torch.float32)


class Sparse(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="keel-sparse-")
        self.count = 0

    def tearDown(self):
        self.tmp.cleanup()

    def run_keel(self, extra="", steps=6, vocab=16, sparse="adagrad", sets=(), ok=True,
                 run_dir=None, dump=None, base=BASE, args=(), nproc=1):
        self.count += 1
        name = f"r{self.count}"
        dump = dump or os.path.join(self.tmp.name, name + ".dump")
        run_dir = run_dir or os.path.join(self.tmp.name, name)
        manifest = os.path.join(self.tmp.name, name + ".toml")
        with open(manifest, "w") as f:
            f.write(base.format(fixtures=FIXTURES, steps=steps, dump=dump, vocab=vocab,
                                sparse=sparse) + extra)
        args = ["train", manifest, "--set", f"run.output_dir={run_dir}", "--log-level", "warn",
                *args]
        for s in sets:
            args += ["--set", s]
        if nproc == 1:
            r = keel(*args, ok=ok)
        else:
            cmd = TORCHRUN + [f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
                              f"--log_dir={os.path.join(self.tmp.name, 'torchrun')}", KEEL, *args]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        return r, run_dir, dump

    def replay(self, dump, make, lr_at):
        """Replays every row's dumped gradients through the torch optimizer `make(param)` with
        lr lr_at(k) at step k (1-based) and compares the values after each step; returns the
        number of rows compared."""
        steps = sorted(dump)
        compared = 0
        for rid in dump[steps[-1]]:
            if not all(rid in dump[s] and dump[s][rid][2] for s in steps):
                continue  # compared on rows touched in every step
            p = torch.nn.Parameter(initial_row(rid))
            opt = make([p])
            for s in steps:
                for g in opt.param_groups:
                    g["lr"] = lr_at(s)
                p.grad = torch.tensor(dump[s][rid][2], dtype=torch.float32)
                opt.step()
                want = p.detach()
                got = torch.tensor(dump[s][rid][0], dtype=torch.float32)
                self.assertTrue(torch.allclose(got, want, rtol=1e-5, atol=1e-7),
                                f"row {rid} at step {s}: {got.tolist()} != {want.tolist()}")
            compared += 1
        return compared

    def test_math_and_schedule(self):
        schedule = '[lr_scheduler]\ntype = "step"\nstep_size = 1\ngamma = 0.5\n'
        lr_at = lambda s: 0.5 * 0.5 ** (s - 1)  # factor(step - 1) before step s
        cases = [
            ("adagrad", "", lambda ps: torch.optim.Adagrad(ps, lr=0.5, eps=1e-10)),
            ("adagrad", "initial_accumulator_value = 0.1\neps = 1e-3\n",
             lambda ps: torch.optim.Adagrad(ps, lr=0.5, eps=1e-3, initial_accumulator_value=0.1)),
            ("adamw", "", lambda ps: torch.optim.AdamW(ps, lr=0.5)),
            ("adamw", "beta1 = 0.8\nbeta2 = 0.95\neps = 1e-6\nweight_decay = 0.1\n",
             lambda ps: torch.optim.AdamW(ps, lr=0.5, betas=(0.8, 0.95), eps=1e-6,
                                          weight_decay=0.1)),
        ]
        for (sparse, options, make), tensors in itertools.product(cases, (False, True)):
            with self.subTest(sparse=sparse, options=options, as_tensors=tensors):
                base = BASE.replace('lr = 0.5\n', 'lr = 0.5\n' + options)
                _, _, dump = self.run_keel(schedule, vocab=3, sparse=sparse, base=base,
                                           sets=[f"model.as_tensors={str(tensors).lower()}"])
                self.assertGreaterEqual(self.replay(read_dump(dump), make, lr_at), 2)

    def test_abi_1_10_sparse_optimizer(self):
        _, _, dump = self.run_keel(steps=2, sparse="abi110_sgd")
        d = read_dump(dump)
        checked = 0
        for rid, (values, _, grads) in d[1].items():
            if not grads:
                continue
            want = initial_row(rid) - 0.5 * torch.tensor(grads, dtype=torch.float32)
            self.assertTrue(torch.allclose(torch.tensor(values), want, rtol=0, atol=1e-7),
                            f"row {rid}: {values} != {want.tolist()}")
            checked += 1
        self.assertGreaterEqual(checked, 2)

    def test_skipped_step_leaves_rows_and_slots(self):
        for sparse in ("adagrad", "adamw"):
            with self.subTest(sparse=sparse):
                _, run, dump = self.run_keel(sparse=sparse,
                                             sets=["model.nan_grad_at=3", "train.nonfinite=skip"])
                d = read_dump(dump)
                for rid, (values, slots, _) in d[2].items():
                    self.assertEqual(d[3][rid][:2], (values, slots), f"row {rid}")
                self.assertNotEqual(d[4], d[3])  # the steps after it update again
                recs = train_records(run)
                self.assertEqual([r["skipped_steps"] for r in recs], [0, 0, 1, 1, 1, 1])
                self.assertIsNone(recs[2]["sparse_grad_norm"])  # NaN: null in JSON
        r, _, _ = self.run_keel(sets=["model.nan_grad_at=3"], ok=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("non-finite gradient norm at step 3", r.stderr)
        self.assertIn("sparse grad norm nan", r.stderr)

    def test_grad_accum_adds_micro_batches(self):
        _, _, one = self.run_keel(steps=3, sets=["data.train.batch_size=8", "data.train.batches=4"])
        _, _, two = self.run_keel(steps=3, sets=["train.grad_accum=2"])
        a, b = read_dump(one), read_dump(two)
        self.assertEqual(sorted(a), [1, 2, 3])
        for s in a:
            self.assertEqual(sorted(a[s]), sorted(b[s]))
            for rid in a[s]:
                for x, y in zip(a[s][rid], b[s][rid]):
                    self.assertTrue(torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-7),
                                    f"step {s} row {rid}: {x} != {y}")

    def test_metrics(self):
        _, run, dump = self.run_keel(steps=8, vocab=40, sets=["model.ttl=2"])
        d, recs = read_dump(dump), train_records(run)
        self.assertEqual(len(recs), 8)
        before, created = set(), 0
        for rec in recs:
            rows = d[rec["step"]]
            self.assertEqual(rec["table_rows"], len(rows))
            touched = [g for (_, _, g) in rows.values() if g]
            created += len(set(rows) - before)  # new ids, and evicted ones seen again
            before = set(rows)
            self.assertEqual(rec["admitted"], created)
            self.assertEqual(rec["evicted"], rec["admitted"] - rec["table_rows"])
            norm = math.sqrt(sum(x * x for g in touched for x in g))
            self.assertAlmostEqual(rec["sparse_grad_norm"], norm, delta=1e-6 * max(1, norm))
        self.assertGreater(recs[-1]["evicted"], 0)

    def test_resume_restores_rows_and_slots(self):
        ck = '[checkpoint]\ntype = "safetensors"\nevery_steps = 3\n'
        for sparse in ("adagrad", "adamw"):
            with self.subTest(sparse=sparse):
                _, _, full = self.run_keel(ck, sparse=sparse)
                run = os.path.join(self.tmp.name, "stopped-" + sparse)
                dump = os.path.join(self.tmp.name, "stopped-" + sparse + ".dump")
                self.run_keel(ck, sparse=sparse, steps=3, run_dir=run, dump=dump)
                step3 = os.path.join(run, "checkpoints", "step-3")
                with open(os.path.join(step3, "commit.json")) as f:
                    record = json.load(f)
                self.assertIn("tables.safetensors", [e["name"] for e in record["files"]])
                self.assertEqual(sorted(t["name"] for t in record["tensors"]["tables"]),
                                 ["ids.counters", "ids.ids", "ids.last_seen", "ids.slots",
                                  "ids.values"])
                self.assertNotIn("sparse_optimizer", record["tensors"])  # no state of its own
                self.run_keel(ck, sparse=sparse, run_dir=run, dump=dump, args=["--resume"])
                a, b = read_dump(full), read_dump(dump)
                with open(dump) as f:  # steps 1-3, the load of step-3's rows, steps 4-6
                    self.assertEqual([l.split()[0] for l in f],
                                     ["1", "2", "3", "load", "4", "5", "6"])
                for s in (4, 5, 6):  # values, slots and gradients, as printed (%.9g: exact)
                    self.assertEqual(a[s], b[s], f"step {s}")

    def test_init_from_loads_tables(self):
        ck = '[checkpoint]\ntype = "safetensors"\nevery_steps = 3\n'
        _, run, dump = self.run_keel(ck, steps=3)
        n = len(read_dump(dump)[3])
        step3 = os.path.join(run, "checkpoints", "step-3")
        _, _, warm = self.run_keel(ck + f'init_from = "{step3}"\n', steps=1)
        self.assertEqual(load_lines(warm), [["load", str(n), str(n)]])
        self.assertGreaterEqual(len(read_dump(warm)[1]), n)

    def test_handed_table_claims(self):
        ck = '[checkpoint]\ntype = "safetensors"\nevery_steps = 3\n'
        _, run, _ = self.run_keel(ck, steps=3)
        step3 = os.path.join(run, "checkpoints", "step-3")
        claims = {"overflow": ("ids.values", [1 << 62, 4]),
                  "8 TiB": ("ids.values", [1 << 39, 4]),
                  "3e9 rows": ("ids.ids", [3_000_000_000])}
        for case, (entry, shape) in claims.items():
            with self.subTest(case=case):
                handed = os.path.join(self.tmp.name, "handed-" + case.replace(" ", "_"))
                shutil.copytree(step3, handed)

                def claim(record):
                    for t in record["tensors"]["tables"]:
                        if t["name"] == entry:
                            t["shape"] = shape
                recommit(handed, claim)
                for args in (["--resume", handed], ["--set", f"checkpoint.init_from={handed}"]):
                    r, _, _ = self.run_keel(ck, steps=4, ok=False, args=args)
                    self.assertEqual(r.returncode, 1, r.stderr)
                    lines = r.stderr.strip().splitlines()
                    self.assertEqual(len(lines), 1, r.stderr)
                    self.assertTrue(lines[0].startswith("keel: error: "), r.stderr)
                    self.assertIn(os.path.join(handed, "commit.json"), lines[0])
                    self.assertIn(f"tensor '{entry}' of object 'tables' claims", lines[0])
                    self.assertNotIn("internal error", r.stderr)

    def test_other_world_size(self):
        """2 ranks -> 1 and 1 -> 2: every saved part in turn, or this rank's ids of the one."""
        ck = '[checkpoint]\ntype = "safetensors"\nevery_steps = 2\n'
        for saved, resumed in ((2, 1), (1, 2)):
            with self.subTest(saved=saved, resumed=resumed):
                run = os.path.join(self.tmp.name, f"w{saved}{resumed}")
                dump = run + ".dump"
                self.run_keel(ck, steps=2, run_dir=run, dump=dump, nproc=saved)
                with open(os.path.join(run, "checkpoints", "step-2", "commit.json")) as f:
                    objects = sorted(json.load(f)["tensors"])
                parts = ["tables"] + [f"rank{r}.tables" for r in range(1, saved)]
                self.assertEqual([o for o in objects if o.endswith("tables")], sorted(parts))
                dumps = [dump] if saved == 1 else [f"{dump}.rank{r}" for r in range(saved)]
                rows = [sorted(read_dump(d)[2]) for d in dumps]  # each part's ids at step 2
                for d in dumps:
                    os.rename(d, d + ".before")
                self.run_keel(ck, run_dir=run, dump=dump, nproc=resumed, args=["--resume"])
                if resumed == 1:
                    loads = load_lines(dump)
                    self.assertEqual(loads, [["load", str(len(r)), str(len(r))] for r in rows])
                else:
                    for r in range(resumed):
                        loads = load_lines(f"{dump}.rank{r}")
                        mine = [i for i in rows[0] if i % resumed == r]
                        self.assertEqual(loads, [["load", str(len(rows[0])), str(len(mine))]])
                        self.assertTrue(set(mine) <= set(read_dump(f"{dump}.rank{r}")[3]))

    def test_errors(self):
        no_sparse = BASE[:BASE.index("[sparse_optimizer]")] + BASE[BASE.index("[loss]"):]
        r, _, _ = self.run_keel(base=no_sparse, ok=False)
        self.assertNotEqual(r.returncode, 0)
        line = [l for l in r.stderr.splitlines() if "error" in l.lower()]
        self.assertEqual(len(line), 1, r.stderr)
        self.assertIn("model 'table_model' (plugin sparse-fixture): has 1 sparse embedding "
                      "table(s) (ids), which only a [sparse_optimizer] trains", line[0])
        self.assertIn('hint: add [sparse_optimizer] with type = "adagrad"', line[0])
        no_tables = BASE.replace('type = "table_model"\ndim = 4\ndump = "{dump}"',
                                 'type = "mlp"\nhidden = [4]').replace(
            'type = "id_batches"\nbatch_size = 4\nbatches = 8\nids = 2\nvocab = {vocab}',
            'type = "fashion_mnist"\nbatch_size = 4\nlimit = 8')
        r, _, _ = self.run_keel(base=no_tables, ok=False)
        line = [l for l in r.stderr.splitlines() if "error" in l.lower()]
        self.assertEqual(len(line), 1, r.stderr)
        self.assertIn("[sparse_optimizer] is set, but [model] model 'mlp'", line[0])
        self.assertIn("hint: remove [sparse_optimizer]", line[0])


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], *sys.argv[3:]], verbosity=2)
