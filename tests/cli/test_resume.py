"""Exact resume: a run stopped at step k and continued with `keel train --resume` ends with the
same parameters and optimizer state (bit for bit: np.array_equal on the raw tensors) and writes
the same metrics records after step k (every key but the timing ones: samples_per_s,
tokens_per_s, step_time_ms, data_time_ms, eval_time_s and checkpoint_time_s, which measure this
machine) as a run that never stopped. The run has AdamW, a warmup-cosine schedule, gradient clipping, shuffling, dropout and
grad_accum = 2 and an `ema` hook whose average the evaluations use: exactness needs the
optimizer's moments, the data position (shuffle order and offset), LibTorch's generator
(dropout), the counters, the log window, the schedule position and the hooks' state (the
average and its update count, compared bit for bit with the parameters).

The stopped run stops through train.max_steps (or, as the README's quickstart does, a lower
train.epochs that the resume raises back); the schedule's length is fixed with
lr_scheduler.total_steps, so that the stop target changes nothing but where the run stops.
The hints of --resume are followed as printed: a changed optimizer.lr is refused with the --set
that sets it back (which then resumes), and a run resumed at its end names the --set that trains
on (which then does).

Usage: test_resume.py KEEL_BINARY SOURCE_ROOT FIXTURE_DIR (meson.build's torch_python; numpy
only). FIXTURE_DIR holds noisy_model.so (tests/fixtures/noisy_model.cpp)."""
import csv
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from safetensors_np import read_arrays

KEEL, ROOT, FIXTURES = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])

# 640 samples, batch 32, grad_accum 2: 10 optimizer steps per epoch; 2 epochs = 20 steps.
MANIFEST = """
[run]
name = "resume"
seed = 11
threads = 1
[train]
epochs = 2
log_every = 4
grad_accum = 2
eval_every_steps = 6
[model]
type = "mlp"
hidden = [32]
dropout = 0.25
[data.train]
type = "fashion_mnist"
batch_size = 32
limit = 640
[data.test]
type = "fashion_mnist"
split = "test"
batch_size = 200
limit = 400
shuffle = false
[optimizer]
type = "adamw"
lr = 3e-3
[lr_scheduler]
type = "cosine"
warmup_steps = 3
total_steps = 20
[loss]
type = "cross_entropy"
[grad_clipper]
type = "norm"
max_norm = 1.0
[checkpoint]
type = "safetensors"
every_steps = 5
[[hooks]]
type = "jsonl"
[[hooks]]
type = "early_stopping"
patience = 100
[[hooks]]
type = "csv"
[[hooks]]
type = "ema"
decay = 0.9
warmup = true
"""

TIMING = {"samples_per_s", "tokens_per_s", "step_time_ms", "data_time_ms", "eval_time_s",
          "checkpoint_time_s"}
def keel(*args, ok=True):
    r = subprocess.run([KEEL, *args], capture_output=True, text=True, timeout=300)
    if ok and r.returncode != 0:
        raise AssertionError(f"keel {' '.join(args)} exited {r.returncode}:\n{r.stderr}")
    return r


def csv_rows(run_dir):
    with open(os.path.join(run_dir, "metrics_train.csv")) as f:
        rows = list(csv.DictReader(f))
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def records(run_dir):
    out = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            out.append({k: v for k, v in rec.items() if k not in TIMING})
    return out


class ExactResume(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="keel-resume-")
        cls.manifest = os.path.join(cls.tmp.name, "m.toml")
        with open(cls.manifest, "w") as f:
            f.write(MANIFEST)
        cls.full = os.path.join(cls.tmp.name, "full")
        keel("train", cls.manifest, "--set", f"run.output_dir={cls.full}", "--log-level", "warn")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def resume_and_compare(self, k, name, *extra):
        run = os.path.join(self.tmp.name, name)
        keel("train", self.manifest, "--set", f"run.output_dir={run}", "--set",
             f"train.max_steps={k}", *extra, "--log-level", "warn")
        self.assertTrue(os.path.isdir(os.path.join(run, "checkpoints", f"step-{k}")))
        return self.resume_to_end_and_compare(run, k, *extra)

    def resume_to_end_and_compare(self, run, k, *extra):
        r = keel("train", self.manifest, "--set", f"run.output_dir={run}", "--resume", *extra)
        self.assertIn(f"checkpoints/step-{k} (step {k},", r.stderr + r.stdout)
        # Parameters, optimizer state (moments, steps, hyper-parameters) and hook state.
        for obj in ("model", "optimizer", "hooks"):
            a = read_arrays(os.path.join(run, "checkpoints", "step-20", f"{obj}.safetensors"))
            b = read_arrays(os.path.join(self.full, "checkpoints", "step-20",
                                              f"{obj}.safetensors"))
            self.assertEqual(sorted(a), sorted(b), obj)
            for t in a:
                self.assertTrue(np.array_equal(a[t], b[t]), f"{obj} tensor {t} differs")
        # Every record after step k; the resumed run's file keeps the stopped run's records up to
        # step k (and drops none of them).
        after = lambda recs: [r for r in recs if r["step"] > k]
        self.assertEqual(after(records(run)), after(records(self.full)))
        self.assertGreater(len(after(records(self.full))), 3)
        # The csv sink too: the header, the stopped run's rows up to k, then the same rows.
        rows, full_rows = csv_rows(run), csv_rows(self.full)
        after_csv = lambda rs: [r for r in rs if int(r["step"]) > k]
        self.assertEqual(after_csv(rows), after_csv(full_rows))
        self.assertEqual([r["step"] for r in rows if int(r["step"]) <= k],
                         [r["step"] for r in full_rows if int(r["step"]) <= k] +
                         ([] if k % 4 == 0 else [str(k)]))
        return run

    def test_mid_epoch(self):
        # Step 13: micro-batch 6 of epoch 1, mid log window (log_every 4), after an evaluation
        # at step 12.
        self.resume_and_compare(13, "mid")

    def test_epoch_boundary(self):
        # Step 10: the last batch of epoch 0; its end-of-epoch events come after the resume.
        self.resume_and_compare(10, "boundary")

    def test_twice_in_one_epoch(self):
        # Stopped at step 12 and, after resuming, again at 15 (both in epoch 1): the second
        # checkpoint's data position counts the epoch's batches from its start.
        run = os.path.join(self.tmp.name, "twice")
        keel("train", self.manifest, "--set", f"run.output_dir={run}", "--set",
             "train.max_steps=12", "--log-level", "warn")
        r = keel("train", self.manifest, "--set", f"run.output_dir={run}", "--resume", "--set",
                 "train.max_steps=15")
        self.assertIn("checkpoints/step-12 (step 12, epoch 1, batch 4 of that epoch)",
                      r.stdout + r.stderr)
        self.resume_to_end_and_compare(run, 15)

    def test_epochs_raised_on_resume(self):
        # Stopped by a lower epochs target (--set train.epochs=1: step 10, the end of epoch 0), a
        # plain --resume continues to the manifest's 2 epochs, warning of the change, exactly as
        # a run that never stopped (the README's quickstart does this; here the schedule's length
        # is total_steps, so the lower target changes nothing but where the run stopped).
        run = os.path.join(self.tmp.name, "epochs")
        keel("train", self.manifest, "--set", f"run.output_dir={run}", "--set", "train.epochs=1",
             "--log-level", "warn")
        self.resume_to_end_and_compare(run, 10)
        with open(os.path.join(run, "run.log")) as f:
            self.assertIn("--resume: train.epochs changed since the checkpoint (1 -> 2)", f.read())

    def test_refusals_name_the_set_that_follows(self):
        # A changed optimizer.lr is refused; the hint's --set (the checkpoint's value, in its
        # shortest form) resumes. A run resumed at its end says so; the hint's --set trains on.
        run = os.path.join(self.tmp.name, "hints")
        out = ("--set", f"run.output_dir={run}")
        keel("train", self.manifest, *out, "--set", "optimizer.lr=1e-3", "--set",
             "train.max_steps=3", "--log-level", "warn")
        r = keel("train", self.manifest, *out, "--resume", ok=False)
        self.assertEqual(r.returncode, 1, r.stderr)
        m = re.search(r"optimizer\.lr changed since the checkpoint \S+ \(0\.001 -> 0\.003\)\. "
                      r".*hint: set it back as the checkpoint has it \((.*)\), or add "
                      r"--resume-changed", r.stderr)
        self.assertIsNotNone(m, r.stderr)
        back = shlex.split(m.group(1))
        self.assertEqual(back, ["--set", "optimizer.lr=0.001"])
        r = keel("train", self.manifest, *out, "--resume", *back, "--set", "train.max_steps=4")
        self.assertIn(f"checkpoints/step-3 (step 3,", r.stdout + r.stderr)
        r = keel("train", self.manifest, *out, "--resume", *back, "--set", "train.max_steps=4")
        m = re.search(r"--resume: the run had already reached its end at step 4 \(max_steps "
                      r"reached\): nothing left to train; hint: .* \(e\.g\. --resume (.*)\)",
                      r.stdout + r.stderr)
        self.assertIsNotNone(m, r.stdout + r.stderr)
        self.assertEqual(shlex.split(m.group(1)), ["--set", "train.max_steps=8"])
        keel("train", self.manifest, *out, *back, "--resume", *shlex.split(m.group(1)))
        self.assertTrue(os.path.isdir(os.path.join(run, "checkpoints", "step-8")))

    def test_async_saves(self):
        self.resume_and_compare(13, "async", "--set", "checkpoint.async=true")

    def test_hook_state_follows_its_label_not_its_position(self):
        run = os.path.join(self.tmp.name, "labels")
        keel("train", self.manifest, "--set", f"run.output_dir={run}", "--set", "train.max_steps=7",
             "--log-level", "warn")
        # A hook inserted before early_stopping: its state is still found (keyed by label).
        moved = os.path.join(self.tmp.name, "moved.toml")
        with open(moved, "w") as f:
            f.write(MANIFEST.replace("[[hooks]]\ntype = \"early_stopping\"",
                                     "[[hooks]]\ntype = \"console\"\n[[hooks]]\n"
                                     "type = \"early_stopping\""))
        r = keel("train", moved, "--set", f"run.output_dir={run}", "--resume", "--set",
                 "train.max_steps=9")
        log = r.stdout + r.stderr
        self.assertNotIn("starts afresh", log)
        self.assertIn("--resume: hooks[1].type changed", log)  # a safe change (its row), listed
        # A different label: that hook starts afresh, and the run says so, naming the state.
        r = keel("train", self.manifest, "--set", f"run.output_dir={run}", "--resume",
                 "--set", "hooks[1].label=es2", "--set", "train.max_steps=11")
        log = r.stdout + r.stderr
        self.assertIn("hook state 'es2.", log)
        self.assertIn("starts afresh", log)
        self.assertIn("holds hook state 'early_stopping.", log)


class PluginState(unittest.TestCase):
    """A model with a generator of its own (tests/fixtures/noisy_model.cpp) resumes exactly
    through its state_save / state_load slots; the control, which saves nothing, does not."""

    def run_pair(self, keep_state):
        with tempfile.TemporaryDirectory(prefix="keel-noisy-") as d:
            # A plugin directory with only this fixture (the fixture directory also holds
            # libraries built to be refused, or to clash with first-party names).
            os.mkdir(f"{d}/plugins")
            os.symlink(f"{FIXTURES}/noisy_model.so", f"{d}/plugins/noisy_model.so")
            m = os.path.join(d, "m.toml")
            with open(m, "w") as f:
                f.write(MANIFEST.replace('[model]\ntype = "mlp"\nhidden = [32]\ndropout = 0.25',
                                         '[model]\ntype = "noisy_linear"') +
                        f'[plugins]\npaths = ["{d}/plugins"]\n')
            keep = f"model.keep_state={'true' if keep_state else 'false'}"
            keel("train", m, "--set", f"run.output_dir={d}/full", "--set", keep, "--log-level",
                 "error")
            keel("train", m, "--set", f"run.output_dir={d}/cut", "--set", keep, "--set",
                 "train.max_steps=13", "--log-level", "error")
            keel("train", m, "--set", f"run.output_dir={d}/cut", "--set", keep, "--resume",
                 "--log-level", "error")
            a = read_arrays(f"{d}/full/checkpoints/step-20/model.safetensors")
            b = read_arrays(f"{d}/cut/checkpoints/step-20/model.safetensors")
            return all(np.array_equal(a[t], b[t]) for t in a)

    def test_generator_state_is_restored(self):
        self.assertTrue(self.run_pair(keep_state=True))
        self.assertFalse(self.run_pair(keep_state=False))


class WarmStart(unittest.TestCase):
    """[checkpoint] init_from with init_include / init_exclude / [checkpoint.init_rename]: only
    the selected model tensors come from the checkpoint (renamed by prefix), the rest keep the
    run's own initialisation; the step counter starts at 0. The loaded weights are read back from
    the step-0 checkpoint ([checkpoint] initial = true) written before the first step."""

    BASE = MANIFEST.replace("hidden = [32]", "hidden = [32, 32, 32]")

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="keel-warm-")
        cls.base = os.path.join(cls.tmp.name, "base")
        path = os.path.join(cls.tmp.name, "base.toml")
        with open(path, "w") as f:
            f.write(cls.BASE)
        keel("train", path, "--set", f"run.output_dir={cls.base}", "--set", "train.max_steps=4",
             "--log-level", "warn")
        cls.trained = read_arrays(os.path.join(cls.base, "checkpoints", "step-4",
                                                    "model.safetensors"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def start(self, name, extra_toml, *sets):
        path = os.path.join(self.tmp.name, name + ".toml")
        with open(path, "w") as f:
            # seed 12: the run's own initialisation differs from the base run's (seed 11).
            f.write(self.BASE.replace("seed = 11", "seed = 12") + extra_toml)
        run = os.path.join(self.tmp.name, name)
        r = keel("train", path, "--set", f"run.output_dir={run}", "--set", "train.max_steps=1",
                 "--set", "checkpoint.initial=true", "--set",
                 f"checkpoint.init_from={self.base}/checkpoints/step-4", *sets)
        return read_arrays(os.path.join(run, "checkpoints", "step-0", "model.safetensors")), \
            r.stdout + r.stderr

    def test_include_and_exclude(self):
        got, log = self.start("inc", "", "--set", "checkpoint.init_include=^fc[12]\\.",
                              "--set", "checkpoint.init_exclude=bias")
        for name in ("fc1.weight", "fc2.weight"):
            self.assertTrue(np.array_equal(got[name], self.trained[name]), name)
        for name in ("fc1.bias", "fc2.bias", "fc3.weight", "fc4.weight"):
            self.assertFalse(np.array_equal(got[name], self.trained[name]), name)
        self.assertIn("loaded 2 model tensor(s), 6 kept their initialisation", log)

    def test_rename(self):
        # The checkpoint's fc2.* start the model's fc3.* (both 32x32); fc2 loads as itself.
        got, _ = self.start("rename", '[checkpoint.init_rename]\n"fc2." = "fc3."\n')
        self.assertTrue(np.array_equal(got["fc3.weight"], self.trained["fc2.weight"]))
        self.assertTrue(np.array_equal(got["fc2.weight"], self.trained["fc2.weight"]))
        self.assertTrue(np.array_equal(got["fc4.weight"], self.trained["fc4.weight"]))

    def test_a_mismatch_is_named(self):
        base = os.path.join(self.tmp.name, "base.toml")
        init = f"checkpoint.init_from={self.base}/checkpoints/step-4"
        r = keel("train", base, "--set", f"run.output_dir={self.tmp.name}/shape", "--set",
                 "model.hidden=[32, 32, 32, 32]", "--set", init, ok=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("tensor 'fc4.weight' has shape [10, 32] in the checkpoint and [32, 32] in "
                      "[model] model 'mlp'", r.stderr)
        self.assertIn("hint: choose the tensors to load with [checkpoint] init_include", r.stderr)
        # Loading only what matches works.
        keel("train", base, "--set", f"run.output_dir={self.tmp.name}/shape", "--set",
             "model.hidden=[32, 32, 32, 32]", "--set", init, "--set", "train.max_steps=1",
             "--set", "checkpoint.init_exclude=^fc[45]\\.")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
