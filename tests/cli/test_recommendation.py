"""Recommendation training end to end: model dlrm (plugins/ctr) with hash-table embeddings, the
sparse adagrad beside adam, loss bce, dataset criteo on windows that keel-criteo-generate wrote
(4 windows of 3,072 records, seed 5; windows = epochs). Each case names what it asserts:

- learns: 3 training windows, the 4th evaluated after each; the last evaluation's exact AUC is
  0.05 above the first's and not above the window's Bayes AUC (truth.json) plus 0.01 (so little
  data stays well below the Bayes AUC: the 0.01 of configs/ctr.toml is measured on its full
  data, docs/recommendation.md), and the train records count every record once: samples =
  3 x 3,072, 12 steps a window.
- exact resume: the same run stopped at step 17 (inside window 1: 12 steps a window) and resumed
  with --resume ends with the uninterrupted run's checkpoint exactly (np.array_equal): dense
  parameters, adam's state, every table's ids, rows, adagrad slots and counters, the dataset's
  IO state; the resumed run's train records after step 17 equal the uninterrupted run's.
- export: the checkpoints after windows 1 and 2 (every_epochs = 1) exported whole and the second
  also as a delta --since the first; tests/cli/safetensors_np.py reads them, and the first
  export with the delta applied (changed rows replaced or added, removed ids dropped) is the
  second export exactly; the delta holds fewer rows than the whole tables.
- two ranks: the same global batch (2 x 128 against 1 x 256) gives every evaluation's AUC and
  loss within 2e-3 of one rank's, and the exported tables hold the same ids, their rows within
  1e-3; both ranks' parts are in the checkpoint (tables, rank1.tables).
- walkthrough: docs/recommendation.md's commands for the small data set as written
  (configs/ctr_small.toml on 8 generated windows of 20,000 records: 7 evaluations, the last AUC
  above 0.75 and not above the window's Bayes AUC plus 0.01, a checkpoint per window, an export
  with the 26 tables), and its overrides for 4 windows (3 trained, 3 evaluations).
- max_rows: with max_rows below the distinct ids of the largest table but above half of them,
  one rank fails with one error line naming the table and max_rows; two ranks train.
- tables as tensors: model.table_tensor_ops = true (the rows read and written with tensor
  operations and handed to adagrad as tensors, ABI 1.11, as tables in device memory are) ends
  with the host path's last checkpoint exactly (np.array_equal: dense parameters, adam's state,
  the tables), on one rank and on two; a sparse optimizer built against ABI 1.10
  (tests/fixtures/abi_1_10.c, host pointers only) is refused with one error line naming it, its
  ABI and a table, exit 1.

Usage: test_recommendation.py KEEL_BINARY GENERATOR FIXTURE_DIR"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launching import TORCHRUN, free_port  # noqa: E402
from safetensors_np import read_arrays  # noqa: E402

KEEL, GENERATOR = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
FIXTURES = os.path.abspath(sys.argv[3])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDS = 3072

MANIFEST = """
[run]
name = "rec"
seed = 3
threads = 1
[train]
epochs = 3
log_every = 6
eval_each_epoch = true
[model]
type = "dlrm"
embedding_dim = 8
bottom_mlp = [16, 8]
top_mlp = [32]
[data.train]
type = "criteo"
path = "{data}"
pattern = "day_00[0-2].tsv"
batch_size = {batch}
[data.test]
type = "criteo"
path = "{data}"
pattern = "day_003.tsv"
batch_size = 1024
[optimizer]
type = "adam"
lr = 3e-3
[sparse_optimizer]
type = "adagrad"
lr = 0.05
[loss]
type = "bce"
[checkpoint]
type = "safetensors"
every_epochs = 1
[[hooks]]
type = "jsonl"
"""


def keel(*args, check=True):
    r = subprocess.run([KEEL, *args], capture_output=True, text=True, timeout=600)
    if check and r.returncode != 0:
        raise AssertionError(f"keel {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def records(run, split):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["split"] == split]


def checkpoint(run, step):
    """Every object of a checkpoint: {object: {tensor: array}}."""
    d = os.path.join(run, "checkpoints", f"step-{step}")
    return {f[:-len(".safetensors")]: read_arrays(os.path.join(d, f))
            for f in sorted(os.listdir(d)) if f.endswith(".safetensors")}


def last_step(run):
    steps = [int(n[5:]) for n in os.listdir(os.path.join(run, "checkpoints"))
             if n.startswith("step-")]
    return max(steps)


class Recommendation(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="keel-rec-")
        cls.data = os.path.join(cls.tmp.name, "data")
        subprocess.run([GENERATOR, "--output", cls.data, "--windows", "4", "--records",
                        str(RECORDS), "--seed", "5"], check=True, capture_output=True)
        with open(os.path.join(cls.data, "truth.json")) as f:
            cls.truth = json.load(f)
        cls.full = cls.run_one("full", batch=256)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def manifest(cls, batch):
        path = os.path.join(cls.tmp.name, f"m{batch}.toml")
        with open(path, "w") as f:
            f.write(MANIFEST.format(data=cls.data, batch=batch))
        return path

    @classmethod
    def run_one(cls, name, batch, *extra):
        run = os.path.join(cls.tmp.name, name)
        keel("train", cls.manifest(batch), "--set", f"run.output_dir={run}", "--log-level",
             "warn", *extra)
        return run

    def test_learns(self):
        evals = records(self.full, "test")
        self.assertEqual(len(evals), 3)
        bayes = self.truth["per_window"][3]["bayes_auc"]
        self.assertGreater(evals[-1]["auc"], evals[0]["auc"] + 0.05, evals)
        self.assertLess(evals[-1]["auc"], bayes + 0.01, (evals[-1], bayes))
        train = records(self.full, "train")
        self.assertEqual(train[-1]["samples"], 3 * RECORDS)
        self.assertEqual(train[-1]["step"], 3 * 12)
        for key in ("table_rows", "admitted", "evicted", "table_pending", "sparse_grad_norm"):
            self.assertIn(key, train[-1])
        self.assertEqual(train[-1]["evicted"], 0)
        self.assertEqual(train[-1]["table_pending"], 0)  # min_count = 1: every id admitted at once
        self.assertEqual(train[-1]["table_rows"], train[-1]["admitted"])

    def test_exact_resume(self):
        run = os.path.join(self.tmp.name, "cut")
        m = self.manifest(256)
        keel("train", m, "--set", f"run.output_dir={run}", "--set", "train.max_steps=17",
             "--log-level", "warn")
        self.assertTrue(os.path.isdir(os.path.join(run, "checkpoints", "step-17")))
        keel("train", m, "--set", f"run.output_dir={run}", "--resume", "--log-level", "warn")
        end = last_step(self.full)
        self.assertEqual(end, 36)
        a, b = checkpoint(run, end), checkpoint(self.full, end)
        self.assertEqual(sorted(a), sorted(b))
        self.assertIn("tables", a)
        for obj in a:
            self.assertEqual(sorted(a[obj]), sorted(b[obj]), obj)
            for t in a[obj]:
                self.assertTrue(np.array_equal(a[obj][t], b[obj][t]), f"{obj} {t} differs")
        strip = lambda rs: [{k: v for k, v in r.items() if not k.endswith(("_per_s", "_ms", "_s"))}
                            for r in rs if r["step"] > 17]
        self.assertEqual(strip(records(run, "train")), strip(records(self.full, "train")))
        # The stopped run evaluated at its end (step 17) too; every evaluation after it is equal.
        self.assertEqual([r["auc"] for r in records(run, "test") if r["step"] > 17],
                         [r["auc"] for r in records(self.full, "test") if r["step"] > 17])

    def test_export_and_delta(self):
        steps = sorted(int(n[5:]) for n in os.listdir(os.path.join(self.full, "checkpoints")))
        first, second = (os.path.join(self.full, "checkpoints", f"step-{s}") for s in steps[:2])
        out = os.path.join(self.tmp.name, "exports")
        keel("export", first, "--format", "safetensors", "--output", f"{out}/a")
        keel("export", second, "--format", "safetensors", "--output", f"{out}/b")
        r = keel("export", second, "--format", "safetensors", "--since", first, "--output",
                 f"{out}/delta")
        self.assertIn("changed row(s)", r.stdout)
        a = read_arrays(f"{out}/a/tables.safetensors")
        b = read_arrays(f"{out}/b/tables.safetensors")
        delta = read_arrays(f"{out}/delta/tables.delta.safetensors")
        self.assertFalse(os.path.exists(f"{out}/delta/tables.safetensors"))
        with open(f"{out}/delta/delta.json") as f:
            info = json.load(f)
        self.assertEqual((info["since_step"], info["step"]), (steps[0], steps[1]))
        tables = sorted({k.rsplit(".", 1)[0] for k in b})
        self.assertEqual(len(tables), 26)
        changed = whole = 0
        for t in tables:
            rows = dict(zip(a[f"{t}.ids"].tolist(), a[f"{t}.values"]))
            for i in delta[f"{t}.removed_ids"].tolist():
                del rows[i]
            for i, v in zip(delta[f"{t}.ids"].tolist(), delta[f"{t}.values"]):
                rows[i] = v
            ids = sorted(rows)
            self.assertEqual(ids, b[f"{t}.ids"].tolist(), t)
            self.assertTrue(np.array_equal(np.stack([rows[i] for i in ids]), b[f"{t}.values"]), t)
            changed += len(delta[f"{t}.ids"])
            whole += len(ids)
        self.assertLess(changed, whole)
        self.assertGreater(changed, 0)

    def torchrun(self, name, batch, *extra, check=True):
        run = os.path.join(self.tmp.name, name)
        cmd = [*TORCHRUN, "--nproc_per_node", "2", "--master_port", str(free_port()), KEEL,
               "train", self.manifest(batch), "--set", f"run.output_dir={run}", "--log-level",
               "warn", *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if check and r.returncode != 0:
            raise AssertionError(f"2 ranks failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return run

    @classmethod
    def two_ranks(cls):
        """The 2-rank run of the full manifest (batch 128 a rank), made once."""
        if not hasattr(cls, "two"):
            cls.two = cls.torchrun(cls, "two", 128)
        return cls.two

    def assert_same_checkpoint(self, a, b):
        end = last_step(a)
        self.assertEqual(last_step(b), end)
        x, y = checkpoint(a, end), checkpoint(b, end)
        for obj in ("model", "optimizer", "tables", "rank1.tables"):
            self.assertEqual(obj in x, obj in y, obj)
            if obj not in x:
                continue
            self.assertEqual(sorted(x[obj]), sorted(y[obj]), obj)
            for k in x[obj]:
                self.assertTrue(np.array_equal(x[obj][k], y[obj][k]), f"{obj}: {k}")

    def test_named_layout(self):
        # criteo's layout = "named" (dense, sparse_ids, sparse_offsets: dlrm's forward_batch)
        # trains what the columns train: the same checkpoint, array for array, and the same
        # evaluations.
        named = self.run_one("named", 256, "--set", 'data.train.layout="named"', "--set",
                             'data.test.layout="named"')
        self.assert_same_checkpoint(self.full, named)
        self.assertEqual([r["auc"] for r in records(named, "test")],
                         [r["auc"] for r in records(self.full, "test")])

    def test_tables_as_tensors(self):
        tensors = ("--set", "model.table_tensor_ops=true")
        self.assert_same_checkpoint(self.full, self.run_one("tensors", 256, *tensors))
        self.assert_same_checkpoint(self.two_ranks(), self.torchrun("tensors2", 128, *tensors))
        run = os.path.join(self.tmp.name, "old_optimizer")
        r = keel("train", self.manifest(256), "--set", f"run.output_dir={run}", *tensors,
                 "--set", f'plugins.paths=["{FIXTURES}"]',
                 "--set", 'sparse_optimizer.type="abi110_sgd"', check=False)
        self.assertEqual(r.returncode, 1, r.stderr[-2000:])
        errors = [l for l in r.stderr.splitlines() if "error" in l.lower()]
        self.assertEqual(len(errors), 1, r.stderr[-2000:])
        self.assertRegex(errors[0], r"abi110_sgd.*ABI 1\.10.*table 'C1'.*hint: ")
        self.assertNotIn("Traceback", r.stderr)

    def test_two_ranks_match_one(self):
        run = self.two_ranks()
        one, two = records(self.full, "test"), records(run, "test")
        self.assertEqual(len(one), len(two))
        for x, y in zip(one, two):
            self.assertEqual(x["step"], y["step"])
            self.assertAlmostEqual(x["auc"], y["auc"], delta=2e-3)
            self.assertAlmostEqual(x["loss"], y["loss"], delta=2e-3)
        end = last_step(run)
        self.assertIn("rank1.tables", checkpoint(run, end))
        out = os.path.join(self.tmp.name, "exports2")
        keel("export", run, "--format", "safetensors", "--output", f"{out}/two")
        keel("export", self.full, "--format", "safetensors", "--output", f"{out}/one")
        a = read_arrays(f"{out}/one/tables.safetensors")
        b = read_arrays(f"{out}/two/tables.safetensors")
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            if k.endswith(".ids"):
                self.assertTrue(np.array_equal(a[k], b[k]), k)
            else:
                np.testing.assert_allclose(a[k], b[k], atol=1e-3, err_msg=k)

    def test_max_rows(self):
        distinct = 0
        with open(os.path.join(self.data, "day_000.tsv")) as f:
            columns = [set() for _ in range(26)]
            for line in f:
                for c, v in zip(columns, line.rstrip("\n").split("\t")[14:]):
                    if v:
                        c.add(v)
        distinct = max(len(c) for c in columns)
        limit = int(distinct * 0.8)
        extra = ("--set", f"model.max_rows={limit}", "--set", "data.train.pattern=day_000.tsv",
                 "--set", "train.epochs=1")
        run = os.path.join(self.tmp.name, "rows1")
        r = keel("train", self.manifest(256), "--set", f"run.output_dir={run}", *extra,
                 check=False)
        self.assertNotEqual(r.returncode, 0)
        errors = [l for l in r.stderr.splitlines() if "max_rows" in l]
        self.assertEqual(len(errors), 1, r.stderr[-2000:])
        self.assertRegex(errors[0], r"C\d+")
        self.assertNotIn("Traceback", r.stderr)
        self.torchrun("rows2", 128, *extra)


class Walkthrough(unittest.TestCase):
    """docs/recommendation.md's overrides for a data set of 4 windows, as written, in a directory
    holding a copy of configs/ (3 windows trained, the 4th evaluated after each). The small data
    set's commands themselves are the README's, run verbatim by tests/cli/test_readme.py."""

    def run_in(self, d, *args):
        r = subprocess.run(list(args), cwd=d, capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, f"{' '.join(args)}:\n{r.stderr[-3000:]}")
        return r

    def test_four_windows(self):
        with tempfile.TemporaryDirectory(prefix="keel-walk4-") as d:
            shutil.copytree(os.path.join(ROOT, "configs"), os.path.join(d, "configs"))
            self.run_in(d, GENERATOR, "--output", "data/ctr-small", "--windows", "4", "--records",
                        "2000")
            r = self.run_in(d, KEEL, "train", "configs/ctr_small.toml", "--set",
                            'data.train.pattern="day_00[0-2].tsv*"', "--set",
                            'data.test.pattern="day_003.tsv*"', "--set", "train.epochs=3")
            run = os.path.join(d, "runs", "ctr_small")
            self.assertEqual(len(records(run, "test")), 3)
            self.assertEqual(records(run, "train")[-1]["samples"], 3 * 2000)
            self.assertIn("epochs done", r.stdout + r.stderr)

if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
