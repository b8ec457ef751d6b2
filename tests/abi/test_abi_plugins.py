"""Plugins built against the frozen ABI 1.0 and 1.1 headers keep working in this kernel.

The fixtures abi_1_0.so and abi_1_1.so (tests/fixtures/abi_1_0.c, abi_1_1.c, compiled against
tests/abi/1.0 and tests/abi/1.1 instead of the SDK's header) each provide an lr_scheduler, an mfu
calculator and a hook. Each test trains a short quickstart with one version's three components
and checks their effects: the lr in metrics.jsonl follows the scheduler's factor, the mfu is
the calculator's formula over the record's samples_per_s, and the hook's event file holds the
expected sequence of events.

Usage: test_abi_plugins.py KEEL_BINARY SOURCE_ROOT FIXTURE_DIR [unittest args]"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

KEEL, ROOT, FIXTURES = (os.path.abspath(a) for a in sys.argv[1:4])

STEPS = 3
BASE_LR = 0.002
PEAK_FLOPS = 1e12
# Training FLOPs per sample of the mlp with hidden = [32] on 784 inputs and 10 classes (the
# models plugin counts 2 FLOPs per multiply-accumulate of the weights, times 3 for training).
FLOPS_PER_SAMPLE = 3.0 * 2.0 * (784 * 32 + 32 * 10)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


class FrozenAbiPlugins(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        # Only the two fixtures, copied into a directory of our own (mode 0700 from mkdtemp):
        # the loader refuses plugin files others can write to, whatever the build's umask was.
        cls.plugins = os.path.join(cls.tmp.name, "plugins")
        os.mkdir(cls.plugins, 0o700)
        for name in ("abi_1_0.so", "abi_1_1.so"):
            shutil.copyfile(os.path.join(FIXTURES, name), os.path.join(cls.plugins, name))
            os.chmod(os.path.join(cls.plugins, name), 0o755)
        cls.env = dict(os.environ, KEEL_PLUGIN_PATH=cls.plugins,
                       XDG_DATA_HOME=os.path.join(cls.tmp.name, "data"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def keel(self, *args):
        p = subprocess.run([KEEL, *args], capture_output=True, text=True, timeout=120,
                           env=self.env)
        return p.returncode, p.stdout, p.stderr

    def train(self, name, tables, train_extra="", train_limit=256):
        """Trains STEPS steps of the quickstart (hidden = [32]) with `tables` swapped in and
        returns (train records, test records, event file lines)."""
        d = os.path.join(self.tmp.name, name)
        os.mkdir(d)
        manifest = os.path.join(d, "m.toml")
        events = os.path.join(d, "events")
        write(manifest, f'''extends = "{ROOT}/configs/quickstart.toml"
[run]
threads = 1
[train]
max_steps = {STEPS}
log_every = 1
{train_extra}
[model]
hidden = [32]
[data.train]
limit = {train_limit}
[data.test]
limit = 100
[optimizer]
lr = {BASE_LR}
''' + tables.format(events=events) + '[[hooks]]\ntype = "jsonl"\n')
        rc, out, err = self.keel("train", manifest, "--set", f"run.output_dir={d}/run")
        self.assertEqual((rc, err), (0, ""), out)
        with open(f"{d}/run/metrics.jsonl") as f:
            records = [json.loads(line) for line in f]
        with open(events) as f:
            lines = f.read().splitlines()
        return ([r for r in records if r["split"] == "train"],
                [r for r in records if r["split"] == "test"], lines)

    def check_listed(self, plugin, minor, components):
        rc, out, err = self.keel("plugins")
        self.assertEqual(rc, 0, err)
        for kind, name in components:
            self.assertRegex(out, rf"(?m)^{kind}\s+{name}\s+{plugin}\s+\S+\s+1\.{minor}\s",
                             f"`keel plugins` must list {name} with ABI 1.{minor}")

    def check_lr_and_mfu(self, train, factor):
        self.assertEqual([r["step"] for r in train], list(range(1, STEPS + 1)))
        for r in train:
            # The record after optimizer step N holds the lr that step used: factor(N - 1).
            self.assertTrue(math.isclose(r["lr"], BASE_LR * factor(r["step"] - 1), rel_tol=1e-12),
                            r)
            expected = FLOPS_PER_SAMPLE * r["samples_per_s"] / PEAK_FLOPS
            self.assertTrue(math.isclose(r["mfu"], expected, rel_tol=1e-12),
                            f"mfu {r['mfu']} != {expected}: {r}")

    def test_abi_1_0_plugin(self):
        self.check_listed("abi10-fixture", 0, [("lr_scheduler", "abi10_constant"),
                                               ("mfu", "abi10_mfu"), ("hook", "abi10_events")])
        train, test, lines = self.train("abi10", f'''[lr_scheduler]
type = "abi10_constant"
factor = 0.25
[mfu]
type = "abi10_mfu"
peak_flops = {PEAK_FLOPS}
[[hooks]]
type = "abi10_events"
path = "{{events}}"
''')
        self.check_lr_and_mfu(train, lambda step: 0.25)
        self.assertEqual([r["step"] for r in test], [STEPS])
        # The events ABI 1.0 defines, in 1.0's call order (one epoch, cut by max_steps: no
        # EPOCH_END; the run ends with the final evaluation and the at_end checkpoint).
        expected = ["TRAIN_START 0", "EPOCH_START 0"]
        for s in range(STEPS):
            expected += [f"STEP_START {s}", f"STEP_END {s + 1}", f"METRICS {s + 1} train"]
        expected += [f"EVAL_START {STEPS} test", f"EVAL_END {STEPS} test",
                     f"METRICS {STEPS} test", f"CHECKPOINT_SAVED {STEPS}", f"TRAIN_END {STEPS}"]
        # Exactly these: the kernel sends a 1.0 hook none of the kinds 1.1 added, which it has
        # no names for (abi_1_0.c would write them as "UNKNOWN <kind> <step>").
        self.assertEqual(lines, expected, "\n".join(lines))

    def test_abi_1_1_plugin(self):
        self.check_listed("abi11-fixture", 1, [("lr_scheduler", "abi11_inverse"),
                                               ("mfu", "abi11_mfu"), ("hook", "abi11_events"),
                                               ("grad_clipper", "abi11_noclip")])
        # grad_accum = 2 (AFTER_DATA per micro-batch), 8 batches: one epoch of 4 steps, cut at 3.
        train, test, lines = self.train("abi11", f'''[lr_scheduler]
type = "abi11_inverse"
factor = 0.5
[mfu]
type = "abi11_mfu"
peak_flops = {PEAK_FLOPS}
[[hooks]]
type = "abi11_events"
path = "{{events}}"
eval_at = 1
''', train_extra="grad_accum = 2", train_limit=512)
        self.check_lr_and_mfu(train, lambda step: 0.5 / (step + 1))
        # The KEEL_REQUEST_EVAL set at STEP_END of step 1 evaluates after step 1.
        self.assertEqual([r["step"] for r in test], [1, STEPS])
        expected = ["TRAIN_START 0", "EPOCH_START 0"]
        for s in range(STEPS):
            expected += [f"STEP_START {s}", f"AFTER_DATA {s} mb0", f"AFTER_DATA {s} mb1",
                         f"AFTER_BACKWARD {s}", f"BEFORE_OPTIMIZER_STEP {s}",
                         f"STEP_END {s + 1}", f"METRICS {s + 1} train"]
            if s + 1 == 1:
                expected += ["EVAL_START 1 test", "EVAL_END 1 test", "METRICS 1 test"]
        expected += [f"EVAL_START {STEPS} test", f"EVAL_END {STEPS} test",
                     f"METRICS {STEPS} test", f"CHECKPOINT_SAVED {STEPS}", f"TRAIN_END {STEPS}"]
        self.assertEqual(lines, expected, "\n".join(lines))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[4:], verbosity=2)
