"""[checkpoint] async = true with several processes (torchrun, 2 ranks, Gloo, CPU), an MLP with
AdamW and [distributed] shard = "optimizer" (so each rank writes its own "rank<r>.model" and
"rank<r>.optimizer" rows; parameters are read whole through the commit record's chunk index),
a checkpoint every 2 steps of 8:

- The asynchronous run ends with the synchronous run's parameters exactly, every checkpoint
  (steps 2, 4, 6, 8) is committed with both ranks' parts and verifies (`keel export` checks
  every file's checksum, and its weights are the synchronous checkpoint's of the same step),
  and both ranks announce each commit.
- Rank 1 killed during a save (KEEL_TEST_KILL_IN_SAVE=6: its writer SIGKILLs its process once
  it has written its part of step 6's save, before reporting it): nothing is committed for
  step 6, and the next `--resume` (2 ranks) resumes from step-4, leaves no staging directory
  behind and ends with the synchronous run's parameters exactly.

Usage: test_async_save.py KEEL_BINARY"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from launching import TORCHRUN, free_port
from safetensors_np import read_checkpoint

KEEL = sys.argv[1]
STEPS = (2, 4, 6, 8)

MANIFEST = """
[run]
name = "{name}"
seed = 3
threads = 1
output_dir = "{out}"
[train]
max_steps = 8
log_every = 2
eval_each_epoch = false
[distributed]
shard = "optimizer"
timeout_s = {timeout}
[model]
type = "mlp"
hidden = [16]
[data.train]
type = "fashion_mnist"
batch_size = 8
limit = 512
[optimizer]
type = "adamw"
lr = 0.01
[loss]
type = "cross_entropy"
[checkpoint]
type = "safetensors"
every_steps = 2
at_end = false
async = {async_}
"""


class AsyncSave(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def manifest(self, name, async_, timeout=60):
        out = os.path.join(self.dir, name)
        path = os.path.join(self.dir, name + ".toml")
        with open(path, "w") as f:
            f.write(MANIFEST.format(name=name, out=out, timeout=timeout,
                                    async_="true" if async_ else "false"))
        return path, out

    def torchrun(self, manifest, *args, env=None):
        cmd = TORCHRUN + ["--nproc_per_node=2", f"--master_port={free_port()}",
                          f"--log_dir={os.path.join(self.dir, 'torchrun')}", KEEL, "train",
                          manifest, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                              env=dict(os.environ, **(env or {})))

    def assert_ok(self, r):
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])

    def model(self, out, step):
        return read_checkpoint(os.path.join(out, "checkpoints", f"step-{step}"))

    def assert_same(self, a, b, what):
        self.assertEqual(list(a), list(b), what)
        for name in a:
            self.assertTrue(np.array_equal(a[name], b[name]), f"{what}: {name}")

    def test_async_against_sync_then_killed_and_resumed(self):
        sync, sync_out = self.manifest("sync", async_=False)
        self.assert_ok(self.torchrun(sync))
        # Every checkpoint committed, with both ranks' parts, and announced by both ranks.
        run, out = self.manifest("async", async_=True)
        r = self.torchrun(run)
        self.assert_ok(r)
        for step in STEPS:
            d = os.path.join(out, "checkpoints", f"step-{step}")
            with open(os.path.join(d, "commit.json")) as f:
                record = json.load(f)
            self.assertEqual(record["step"], step)
            for stem in ("model", "rank1.model", "rank0.optimizer", "rank1.optimizer", "rng",
                         "rank1.rng"):
                self.assertIn(stem, record["tensors"], f"step {step}")
            announced = re.findall(rf"checkpoint committed: {re.escape(d)}\n", r.stdout)
            self.assertEqual(len(announced), 2, f"step {step}: {r.stdout[-3000:]}")
            # The files verify, and hold what the synchronous save of that step holds.
            exported = os.path.join(self.dir, f"export-{step}")
            e = subprocess.run([KEEL, "export", d, "--format", "safetensors", "--output",
                                exported], capture_output=True, text=True, timeout=120)
            self.assertEqual(e.returncode, 0, e.stderr)
            self.assert_same(self.model(out, step), self.model(sync_out, step), f"step {step}")
            self.assertTrue(os.path.exists(os.path.join(exported, "model.safetensors")))
        self.assertEqual(sorted(os.listdir(os.path.join(out, "checkpoints"))),
                         [f"step-{s}" for s in STEPS])

        # Rank 1 dies while writing its part of step 6's save: step 6 is never committed.
        killed, killed_out = self.manifest("killed", async_=True, timeout=5)
        r = self.torchrun(killed, env={"KEEL_TEST_KILL_IN_SAVE": "6"})
        self.assertNotEqual(r.returncode, 0, r.stdout[-3000:])
        ckpts = os.path.join(killed_out, "checkpoints")
        self.assertFalse(os.path.exists(os.path.join(ckpts, "step-6")), os.listdir(ckpts))
        self.assertTrue(os.path.exists(os.path.join(ckpts, "step-4", "commit.json")))
        # The next --resume starts from the previous complete checkpoint and ends as the
        # synchronous run did.
        r = self.torchrun(killed, "--resume")
        self.assert_ok(r)
        self.assertIn(f"resuming from {os.path.join(ckpts, 'step-4')} (step 4,", r.stdout)
        self.assertEqual(sorted(os.listdir(ckpts)), [f"step-{s}" for s in STEPS])
        self.assert_same(self.model(killed_out, 8), self.model(sync_out, 8), "resumed")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]])
