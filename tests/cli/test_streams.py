"""Streams (batches_per_epoch -1, ABI 1.9), [checkpoint] every_epochs, and keel_comm for
components, with the fixtures of tests/fixtures/stream_fixture.cpp:

- keel_comm on 1, 2 and 3 ranks (one table, each rank count a case): the model comm_check runs
  a table of all_to_all and all_gather exchanges (4 dtypes, 1-3 dimensions, zero rows, empty
  rows) in every forward and fails on a wrong count or value; every rank logs that its checks
  passed, and the run ends when the stream does, after the same steps at every rank count.
- One rank sending F64 where the others send F32: every rank fails with one line naming it.
- A stream of windows of 3, 5 and 2 batches with grad_accum 2 and epochs 10: steps 2 + 3 + 1 =
  6, the run ends because the stream ended (epoch 3 had no batch); every_epochs = 2 saves
  after epoch 1 (step 5) and at_end at step 6; eval_each_epoch evaluates after each window
  (steps 2, 5, 6).
- Resume inside a window: stopped by max_steps at step 3 (window 1, after 2 of its 5 batches),
  continued with --resume: the data log reads every batch exactly once, in the uninterrupted
  run's order, and the parameters at the end equal the uninterrupted run's exactly.
- 2 ranks whose stream windows differ by one batch: both fail at the same step with one line
  naming each rank's micro-batches.
- The criteo dataset (issue 43, finding 6): a run stopped inside window 0, its data directory
  moved, resumes with --resume-changed and the new [data.train] path and ends with the
  uninterrupted run's weights exactly (the IO state names its window relative to the path).

Ranks are started by hand with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (keel's launch
detection), as torchrun would.

Usage: test_streams.py KEEL_BINARY FIXTURE_DIR"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from launching import free_port
from safetensors_np import read_arrays

KEEL, FIXTURES = sys.argv[1], os.path.abspath(sys.argv[2])

MANIFEST = """
[plugins]
paths = ["{plugins}"]
[run]
name = "stream"
seed = 3
threads = 1
output_dir = "{out}"
[train]
epochs = 10
grad_accum = {accum}
log_every = 1
[distributed]
timeout_s = 60
[model]
type = "comm_check"
bad = "{bad}"
[data.train]
type = "stream_data"
windows = {windows}
uneven_rank = {uneven_rank}
uneven_window = 1
[data.test]
type = "stream_data"
windows = [2]
[optimizer]
type = "sgd"
lr = 0.1
[loss]
type = "cross_entropy"
[checkpoint]
type = "safetensors"
every_epochs = 2
[[hooks]]
type = "jsonl"
"""


def read(path):
    with open(path) as f:
        return f.read()


class Streams(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="keel-streams-")
        cls.plugins = os.path.join(cls.tmp.name, "plugins")
        os.makedirs(cls.plugins)
        shutil.copy(os.path.join(FIXTURES, "stream_fixture.so"), cls.plugins)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def manifest(self, name, accum=2, windows="[3, 5, 2]", bad="none", uneven_rank=-1):
        out = os.path.join(self.tmp.name, name)
        path = out + ".toml"
        with open(path, "w") as f:
            f.write(MANIFEST.format(plugins=self.plugins, out=out, accum=accum, windows=windows,
                                    bad=bad, uneven_rank=uneven_rank))
        return path, out

    def train(self, manifest, *args, nproc=1):
        """Runs keel train on `nproc` ranks; returns [(returncode, output)] by rank."""
        port = free_port()
        procs = []
        for rank in range(nproc):
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "SLURM_", "OMPI_",
                                        "MASTER_", "TORCHELASTIC"))}
            if nproc > 1:
                env.update({"RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank),
                            "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": str(port)})
            procs.append(subprocess.Popen([KEEL, "train", manifest, *args], env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outs = [p.communicate(timeout=240)[0] for p in procs]
        return [(p.returncode, o) for p, o in zip(procs, outs)]

    def records(self, out, split):
        recs = [json.loads(line) for line in read(os.path.join(out, "metrics.jsonl")).splitlines()]
        return [r for r in recs if r.get("split") == split]

    def test_comm_on_one_two_and_three_ranks(self):
        for nproc in (1, 2, 3):
            with self.subTest(ranks=nproc):
                path, out = self.manifest(f"comm{nproc}", accum=1, windows="[2, 1]")
                results = self.train(path, nproc=nproc)
                for rank, (code, text) in enumerate(results):
                    self.assertEqual(code, 0, text[-3000:])
                    self.assertIn(f"comm checks passed on rank {rank} of {nproc}", text)
                self.assertIn("run finished at step 3: the stream ended (epoch 2 had no batch)",
                              results[0][1])

    def test_comm_refuses_another_dtype(self):
        path, out = self.manifest("baddtype", accum=1, windows="[2]", bad="dtype")
        results = self.train(path, nproc=2)
        for code, text in results:
            self.assertNotEqual(code, 0, text[-3000:])
            self.assertIn("keel_comm all_gather: rank 1 sends Double rows of 2 dimension(s) with "
                          "2 element(s) each and rank 0 Float rows of 2 dimension(s) with 2 "
                          "element(s) each", text)

    def test_windows_epochs_and_checkpoints(self):
        path, out = self.manifest("windows")
        (code, text), = self.train(path)
        self.assertEqual(code, 0, text[-3000:])
        self.assertIn("run finished at step 6: the stream ended (epoch 3 had no batch)", text)
        self.assertEqual(sorted(os.listdir(os.path.join(out, "checkpoints"))),
                         ["step-5", "step-6"])
        self.assertEqual([r["step"] for r in self.records(out, "test")], [2, 5, 6])
        self.assertEqual([(r["step"], r["epoch"]) for r in self.records(out, "train")],
                         [(1, 0), (2, 0), (3, 1), (4, 1), (5, 1), (6, 2)])
        every = [tuple(map(int, line.split()))
                 for line in read(os.path.join(out, "data.train.rank0.txt")).splitlines()]
        self.assertEqual(every, [(e, b) for e, n in enumerate((3, 5, 2)) for b in range(n)])

    def test_resume_inside_a_window(self):
        full_path, full = self.manifest("full")
        self.assertEqual(self.train(full_path)[0][0], 0)
        path, out = self.manifest("stopped")
        (code, text), = self.train(path, "--set", "train.max_steps=3")
        self.assertEqual(code, 0, text[-3000:])
        self.assertTrue(os.path.isdir(os.path.join(out, "checkpoints", "step-3")))
        (code, text), = self.train(path, "--resume")
        self.assertEqual(code, 0, text[-3000:])
        self.assertIn("(step 3, epoch 1, batch 2 of that epoch)", text)
        self.assertEqual(read(os.path.join(out, "data.train.rank0.txt")),
                         read(os.path.join(full, "data.train.rank0.txt")))
        a = read_arrays(os.path.join(out, "checkpoints", "step-6", "model.safetensors"))
        b = read_arrays(os.path.join(full, "checkpoints", "step-6", "model.safetensors"))
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertTrue(np.array_equal(a[name], b[name]), name)

    def test_ranks_ending_a_window_at_different_steps(self):
        # Window 1 has 3 batches on rank 0 and 4 on rank 1: steps 1-2 (window 0), 3-5, then at
        # step 6 rank 0's window is over and rank 1 has one batch more.
        path, out = self.manifest("uneven", accum=1, windows="[2, 3]", uneven_rank=1)
        results = self.train(path, nproc=2)
        for code, text in results:
            self.assertNotEqual(code, 0, text[-3000:])
            self.assertIn("a stream whose ranks' data ends epoch 1 at different steps: "
                          "micro-batches for step 6 (up to 1): rank 0 0, rank 1 1, after 3 in "
                          "this epoch", text)


CRITEO = """
[run]
name = "criteo"
seed = 3
threads = 1
output_dir = "{out}"
[train]
epochs = 10
log_every = 1
[model]
type = "dlrm"
embedding_dim = 4
bottom_mlp = [8, 4]
top_mlp = [8]
[data.train]
type = "criteo"
path = "{data}"
batch_size = 16
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
"""


def criteo_windows(directory, windows=2, records=48):
    """Criteo-format windows day_000.tsv, ... of `records` lines each (issue 43, finding 6)."""
    os.makedirs(directory)
    for w in range(windows):
        with open(os.path.join(directory, f"day_{w:03d}.tsv"), "w") as f:
            for i in range(records):
                ints = [str((i * k + w) % 9 - 2) for k in range(1, 14)]
                cats = [format((i * 31 + k * 7 + w) % 97, "x") for k in range(1, 27)]
                f.write("\t".join([str((i + w) % 2)] + ints + cats) + "\n")


class CriteoDataMoved(unittest.TestCase):
    """The criteo dataset's IO state names its window relative to [data.train] path (issue 43,
    finding 6): a run stopped by max_steps inside window 0, its data directory moved, resumes
    with --resume-changed and the new path at exactly the next record, and ends with the
    uninterrupted run's weights (the keel before saved the old absolute path and failed:
    'cannot open')."""

    def test_resume_after_the_data_directory_moved(self):
        with tempfile.TemporaryDirectory(prefix="keel-criteo-moved-") as tmp:
            def manifest(name, data):
                out = os.path.join(tmp, name)
                with open(out + ".toml", "w") as f:
                    f.write(CRITEO.format(out=out, data=data))
                return out + ".toml", out

            def train(*args):
                p = subprocess.run([KEEL, "train", *args], text=True, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, timeout=240)
                self.assertEqual(p.returncode, 0, p.stdout[-3000:])
                return p.stdout

            old, new = os.path.join(tmp, "old"), os.path.join(tmp, "new")
            criteo_windows(old)
            full_path, full = manifest("full", old)
            train(full_path)
            path, out = manifest("stopped", old)
            train(path, "--set", "train.max_steps=2")
            os.rename(old, new)
            text = train(path, "--resume", "--resume-changed", "--set", f"data.train.path={new}")
            self.assertIn("(step 2, epoch 0, batch 2 of that epoch)", text)
            a = read_arrays(os.path.join(out, "checkpoints", "step-6", "model.safetensors"))
            b = read_arrays(os.path.join(full, "checkpoints", "step-6", "model.safetensors"))
            self.assertEqual(sorted(a), sorted(b))
            for name in a:
                self.assertTrue(np.array_equal(a[name], b[name]), name)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
