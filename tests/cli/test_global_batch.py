"""[train] global_batch and the normalisation of the loss by the global number of items.

- Global item normalisation: a tiny gpt (tokens, token_cross_entropy with ignore_index 0) where
  rank 0's samples have 6 of 8 targets ignored and rank 1's none. 2 ranks (torchrun) x
  batch_size 4 with global_batch 16 (2 micro-batches per rank and step) end 3 SGD steps with
  the parameters of 1 process x batch_size 4 with global_batch 16 (4 micro-batches), within
  1e-6 (absolute, per element), and every step's loss within 1e-6. Both logs name the derived
  micro-batches. The same 2-rank run with accum_normalization = "mean" (each micro-batch's
  mean weighted 1/k) differs by more than 1e-4: the data makes the normalisation matter.
- [train] micro_batch_size: batch_size 16 split into micro-batches of 4 rows trains the
  parameters and losses of batch_size 4 with global_batch 16 bit for bit, and those of the
  unsplit batch of 16 within 1e-6 (which differ from batch_size 4 alone by more than 1e-4).
  On 2 ranks whose batches hold different rows (81 samples, remainder = "uneven") with
  shard = "gradients", the rank whose split makes fewer micro-batches halves one, so that the
  step finishes; rows too few for that stop both ranks with one line.
- The resolved manifest: a 1-process run's manifest.resolved.toml (grad_accum derived, so not
  written beside global_batch) trains the same parameters again, bit for bit, and `keel export`
  of the run reads its checkpoint.
- Bad input (exit 1, one `keel: error:` line): global_batch 24 with batch_size 8 under a
  launcher of 2 ranks (`keel validate` with the launcher's variables) names 24, 8, 2 and 16;
  global_batch 20 with batch_size 8 on one process names 20, 8, 1 and 8; global_batch beside
  grad_accum names grad_accum's file:line:col.

Usage: test_global_batch.py KEEL_BINARY"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from launching import TORCHRUN, free_port, write_tokens
from safetensors_np import read_arrays

KEEL = sys.argv[1]
CTX, VOCAB, WINDOWS = 8, 16, 80

MANIFEST = """
[run]
name = "gb"
seed = 7
threads = 1
output_dir = "{out}"
[train]
max_steps = 3
log_every = 1
{train}
[model]
type = "gpt"
vocab_size = {vocab}
context = {ctx}
layers = 1
heads = 2
width = 16
[data.train]
type = "tokens"
path = "{data}"
context = {ctx}
batch_size = {batch}
sampling = "sequential"
[optimizer]
type = "sgd"
lr = 0.5
[loss]
type = "token_cross_entropy"
ignore_index = 0
[checkpoint]
type = "safetensors"
[[hooks]]
type = "jsonl"
"""


class GlobalBatch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        # Window k (sequential sampling) holds tokens k*CTX .. k*CTX + CTX; its targets are
        # tokens k*CTX + 1 .. k*CTX + CTX. Two ranks take windows r, r + 2, ...: the even ones
        # (rank 0) get 6 of their 8 targets ignored (token 0), the odd ones none.
        rng = np.random.default_rng(3)
        tokens = rng.integers(1, VOCAB, size=WINDOWS * CTX + 1)
        for k in range(0, WINDOWS, 2):
            tokens[k * CTX + 1:k * CTX + 7] = 0
        cls.data = write_tokens(cls.dir, tokens, VOCAB)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def manifest(self, name, train, batch=4):
        out = os.path.join(self.dir, name)
        path = os.path.join(self.dir, name + ".toml")
        with open(path, "w") as f:
            f.write(MANIFEST.format(out=out, train=train, vocab=VOCAB, ctx=CTX, data=self.data,
                                    batch=batch))
        return path, out

    def train(self, name, train, nproc, batch=4):
        path, out = self.manifest(name, train, batch)
        if nproc == 1:
            cmd = [KEEL, "train", path]
        else:
            cmd = TORCHRUN + [f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
                              f"--log_dir={os.path.join(self.dir, 'torchrun-' + name)}", KEEL,
                              "train", path]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        model = read_arrays(os.path.join(out, "checkpoints", "step-3", "model.safetensors"))
        with open(os.path.join(out, "metrics.jsonl")) as f:
            losses = [r["loss"] for r in map(json.loads, f) if r.get("split") == "train"]
        with open(os.path.join(out, "run.log")) as f:
            log = f.read()
        return model, losses, log

    def max_diff(self, a, b):
        self.assertEqual(sorted(a), sorted(b))
        return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)

    def test_two_ranks_equal_one(self):
        one, one_losses, one_log = self.train("one", "global_batch = 16", 1)
        two, two_losses, two_log = self.train("two", "global_batch = 16", 2)
        self.assertIn("train.global_batch = 16: 4 micro-batch(es) of 4 per rank and step, on 1 "
                      "rank(s)", one_log)
        self.assertIn("train.global_batch = 16: 2 micro-batch(es) of 4 per rank and step, on 2 "
                      "rank(s)", two_log)
        self.assertEqual(len(one_losses), 3)
        self.assertEqual(len(two_losses), 3)
        for a, b in zip(one_losses, two_losses):
            self.assertLessEqual(abs(a - b), 1e-6, (one_losses, two_losses))
        d = self.max_diff(one, two)
        print(f"2 ranks vs 1 rank, global item normalisation: max |param diff| {d:.3g}, "
              f"losses {one_losses} vs {two_losses}")
        self.assertLessEqual(d, 1e-6)
        mean, _, _ = self.train("mean", 'global_batch = 16\naccum_normalization = "mean"', 2)
        d_mean = self.max_diff(one, mean)
        print(f"2 ranks with accum_normalization = \"mean\": max |param diff| {d_mean:.3g}")
        self.assertGreater(d_mean, 1e-4)

    def test_micro_batch_size(self):
        # batch_size 16 split into micro-batches of 4 rows (micro_batch_size = 4) runs the
        # micro-batches of batch_size 4 with global_batch 16: the same windows, the same item
        # weights (6 of 8 targets ignored in every other window), so the same parameters and
        # losses bit for bit; and the unsplit batch of 16 (one forward over all) within 1e-6.
        split, split_losses, _ = self.train("split", "micro_batch_size = 4", 1, batch=16)
        four, four_losses, _ = self.train("four", "global_batch = 16", 1)
        whole, whole_losses, _ = self.train("whole", "", 1, batch=16)
        self.assertEqual(split_losses, four_losses)
        self.assertEqual(sorted(split), sorted(four))
        for k in split:
            self.assertTrue(np.array_equal(split[k], four[k]), k)
        d = self.max_diff(split, whole)
        print(f"micro_batch_size 4 of batch 16 vs the whole batch: max |param diff| {d:.3g}")
        self.assertLessEqual(d, 1e-6)
        self.assertGreater(self.max_diff(whole, self.train("small", "", 1)[0]), 1e-4)

    def test_micro_batch_size_uneven_ranks(self):
        # 81 samples over 2 ranks (remainder = "uneven"): rank 0's batches hold 16, 16 and 9
        # rows, rank 1's 16, 16 and 8. With micro_batch_size 4, rank 0's split makes 11
        # micro-batches and rank 1's 10; shard = "gradients" reduce-scatters after every
        # micro-batch's backward, so the ranks must run as many: rank 1 halves one (the run
        # finishes its step with every sample). With micro_batch_size 1, every micro-batch is
        # one row: rank 1's 40 rows cannot make rank 0's 41, and both ranks stop with one line.
        out = os.path.join(self.dir, "uneven")
        path = os.path.join(self.dir, "uneven.toml")
        with open(path, "w") as f:
            f.write(f"""[run]
seed = 3
threads = 1
output_dir = "{out}"
[train]
epochs = 1
grad_accum = 3
micro_batch_size = 4
log_every = 1
[distributed]
shard = "gradients"
timeout_s = 30
[model]
type = "mlp"
hidden = [8]
[data.train]
type = "fashion_mnist"
limit = 81
batch_size = 16
remainder = "uneven"
shuffle = false
[optimizer]
type = "sgd"
lr = 0.05
[loss]
type = "cross_entropy"
[[hooks]]
type = "jsonl"
""")

        def torchrun(*args):
            return subprocess.run(
                TORCHRUN + ["--nproc_per_node=2", f"--master_port={free_port()}",
                            f"--log_dir={os.path.join(self.dir, 'torchrun-uneven')}", KEEL,
                            "train", path, *args], capture_output=True, text=True, timeout=120)
        r = torchrun()
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        with open(os.path.join(out, "metrics.jsonl")) as f:
            train = [x for x in map(json.loads, f) if x["split"] == "train"]
        self.assertEqual([(x["step"], x["samples"]) for x in train], [(1, 81)])
        r = torchrun("--set", "train.micro_batch_size=1", "--set",
                     f"run.output_dir={out}-one")
        self.assertEqual(r.returncode, 1, r.stdout[-3000:] + r.stderr[-3000:])
        errors = [x for x in r.stderr.splitlines() if "keel: error:" in x]
        self.assertEqual(len(errors), 2, r.stderr[-3000:])
        for e in errors:
            self.assertIn("[train] micro_batch_size = 1: at step 1 a rank's batches hold 40 "
                          "row(s), too few for the 41 micro-batches another rank's make", e)

    def test_resolved_manifest_reruns_and_exports(self):
        # The run's own manifest.resolved.toml (global_batch set, grad_accum derived from it)
        # trains the same run again, bit for bit, and `keel export` (which resolves it) reads
        # the run's checkpoint.
        one, _, _ = self.train("resolved", "global_batch = 16", 1)
        out = os.path.join(self.dir, "resolved")
        again = os.path.join(self.dir, "rerun")
        r = subprocess.run([KEEL, "train", os.path.join(out, "manifest.resolved.toml"), "--set",
                            f"run.output_dir={again}"], capture_output=True, text=True,
                           timeout=240)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertIn("train.global_batch = 16: 4 micro-batch(es) of 4 per rank and step",
                      r.stdout + r.stderr)
        rerun = read_arrays(os.path.join(again, "checkpoints", "step-3", "model.safetensors"))
        self.assertEqual(sorted(one), sorted(rerun))
        for k in one:
            self.assertTrue(np.array_equal(one[k], rerun[k]), k)
        r = subprocess.run([KEEL, "export", out, "--format", "safetensors"], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertTrue(os.path.isfile(os.path.join(out, "exports", "step-3",
                                                    "model.safetensors")))

    def error_of(self, cmd, env=None):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        lines = r.stderr.strip().splitlines()
        self.assertEqual((r.returncode, len(lines)), (1, 1), r.stderr)
        self.assertTrue(lines[0].startswith("keel: error: "), lines[0])
        return lines[0]

    def test_bad_input(self):
        path, out = self.manifest("bad", "global_batch = 24", batch=8)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "SLURM_", "OMPI_"))}
        env.update(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        line = self.error_of([KEEL, "validate", path], env)
        self.assertIn(f"{path}:", line)
        self.assertIn("train.global_batch = 24 is not a multiple of [data.train] batch_size 8 x "
                      "2 rank(s) = 16", line)
        # Alone (no launcher variables), 24 = 3 x 8 divides.
        alone = {k: v for k, v in env.items()
                 if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        r = subprocess.run([KEEL, "validate", path], capture_output=True, text=True, env=alone)
        self.assertEqual(r.returncode, 0, r.stderr)
        path, out = self.manifest("bad1", "global_batch = 20", batch=8)
        line = self.error_of([KEEL, "train", path], alone)
        self.assertIn("train.global_batch = 20 is not a multiple of [data.train] batch_size 8 x "
                      "1 rank(s) = 8", line)
        self.assertFalse(os.path.exists(out), "the failed start left its run directory")
        path, _ = self.manifest("both", "global_batch = 16\ngrad_accum = 2", batch=4)
        line = self.error_of([KEEL, "validate", path], alone)
        self.assertIn(f"{path}:11:", line)
        self.assertIn("train.grad_accum: grad_accum and global_batch are both set", line)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[2:], verbosity=2)
