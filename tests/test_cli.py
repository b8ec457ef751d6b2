"""CLI behaviour on good and bad input: one clear error line, a non-zero exit, no abort and
no stack trace. Usage: test_cli.py KEEL_BINARY SOURCE_ROOT"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

KEEL, ROOT = sys.argv[1], sys.argv[2]


def keel(*args, cwd=None):
    p = subprocess.run([KEEL, *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    return p.returncode, p.stdout, p.stderr


class BadInput(unittest.TestCase):
    def assert_one_error_line(self, rc, err, *parts):
        self.assertIn(rc, (1, 2), err)  # not a signal (negative) and not success
        lines = err.strip().splitlines()
        self.assertTrue(lines and lines[0].startswith("keel: error: "), err)
        if rc == 1:
            self.assertEqual(len(lines), 1, err)
        for part in parts:
            self.assertIn(part, lines[0])
        self.assertNotIn("Exception raised from", err)
        self.assertNotIn("terminate called", err)

    def test_missing_manifest(self):
        rc, _, err = keel("train", "/nonexistent/m.toml")
        self.assert_one_error_line(rc, err, "/nonexistent/m.toml", "manifest not found")

    def test_unknown_key_points_at_file_line_col(self):
        with tempfile.TemporaryDirectory() as d:
            m = os.path.join(d, "m.toml")
            with open(m, "w") as f:
                f.write(f'extends = "{ROOT}/configs/quickstart.toml"\n[optimizer]\nlrr = 1\n')
            rc, _, err = keel("validate", m)
            self.assert_one_error_line(rc, err, f"{m}:3:1: unknown key 'lrr' in [optimizer]",
                                       "did you mean 'lr'?")

    def test_bad_override(self):
        rc, _, err = keel("validate", f"{ROOT}/configs/quickstart.toml", "--set",
                          "train.epochs=-3")
        self.assert_one_error_line(rc, err, "--set train.epochs=-3: train.epochs: must be in")

    def test_missing_dataset_file_is_named(self):
        with tempfile.TemporaryDirectory() as d:
            rc, _, err = keel("train", f"{ROOT}/configs/quickstart.toml", "--set",
                              f"data.train.path={d}", "--set", f"run.output_dir={d}/run")
            self.assert_one_error_line(rc, err, "[data.train]", "fashion_mnist",
                                       f"{d}/train-images-idx3-ubyte.gz")

    def test_plugin_failure_names_the_plugin(self):
        rc, _, err = keel("validate", f"{ROOT}/configs/quickstart.toml", "--set",
                          "optimizer.type=nadam")
        self.assert_one_error_line(rc, err, "no optimizer named 'nadam'", "keel plugins")

    def test_unknown_command_and_missing_argument(self):
        rc, _, err = keel("trian")
        self.assertEqual(rc, 2)
        self.assertIn("keel: error: unknown command 'trian'", err)
        rc, _, err = keel("train")
        self.assertEqual(rc, 2)
        self.assertIn("needs a MANIFEST", err)


class GoodInput(unittest.TestCase):
    def test_validate_ok(self):
        rc, out, err = keel("validate", f"{ROOT}/configs/quickstart.toml")
        self.assertEqual(rc, 0, err)
        self.assertIn(": ok", out)

    def test_plugins_lists_every_kind(self):
        rc, out, _ = keel("plugins")
        self.assertEqual(rc, 0)
        kinds = {line.split()[0] for line in out.splitlines()[1:] if line.strip()}
        for kind in ["model", "dataset", "optimizer", "lr_scheduler", "loss", "grad_clipper",
                     "mfu", "profiler", "checkpoint", "hook"]:
            self.assertIn(kind, kinds)

    def test_plugins_show_lists_options(self):
        rc, out, _ = keel("plugins", "show", "adamw")
        self.assertEqual(rc, 0)
        self.assertIn("weight_decay", out)
        self.assertIn("default 0.01", out)
        rc, _, err = keel("plugins", "show", "adamww")
        self.assertEqual(rc, 1)
        self.assertIn("did you mean 'adamw'?", err)

    def test_train_then_evaluate_the_checkpoint(self):
        with tempfile.TemporaryDirectory() as d:
            common = [f"{ROOT}/configs/quickstart.toml", "--set", "data.train.limit=2048",
                      "--set", "data.test.limit=1000", "--set", "lr_scheduler.warmup_steps=5"]
            rc, _, err = keel("train", *common, "--set", "train.max_steps=40",
                              "--set", f"run.output_dir={d}/train")
            self.assertEqual(rc, 0, err)
            with open(f"{d}/train/metrics.jsonl") as f:
                final = [json.loads(line) for line in f][-1]
            self.assertEqual(final["split"], "test")
            rc, out, err = keel("evaluate", *common, "--set", f"run.output_dir={d}/eval",
                                "--set", f"checkpoint.init_from={d}/train/checkpoints/step-40")
            self.assertEqual(rc, 0, err)
            with open(f"{d}/eval/metrics.jsonl") as f:
                records = [json.loads(line) for line in f]
            self.assertEqual([r["split"] for r in records], ["test"])
            self.assertEqual(records[0]["accuracy"], final["accuracy"])
            self.assertAlmostEqual(records[0]["loss"], final["loss"], places=6)
            self.assertFalse(os.path.exists(f"{d}/eval/checkpoints/step-0"))

    def test_version(self):
        rc, out, _ = keel("--version")
        self.assertEqual(rc, 0)
        self.assertRegex(out, r"keel \d+\.\d+\.\d+ \(plugin ABI 1\.\d+, LibTorch ")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
