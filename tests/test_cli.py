"""CLI behaviour on good and bad input: one clear error line, a non-zero exit, no abort and
no stack trace. Usage: test_cli.py KEEL_BINARY SOURCE_ROOT"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

KEEL, ROOT = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])


def keel(*args, cwd=None, env=None):
    full_env = {k: v for k, v in os.environ.items() if k != "KEEL_LOG_LEVEL"}
    full_env.update(env or {})
    p = subprocess.run([KEEL, *args], capture_output=True, text=True, cwd=cwd, timeout=120,
                       env=full_env)
    return p.returncode, p.stdout, p.stderr


# Every flag of each command, as `keel COMMAND --help` must list it.
FLAGS = {
    None: ["--set", "--log-level", "--help", "-h", "--version"],
    "train": ["--set", "--log-level", "--help"],
    "evaluate": ["--set", "--log-level", "--help"],
    "validate": ["--set", "--log-level", "--help"],
    "plugins": ["--log-level", "--help"],
    "options": ["--log-level", "--help"],
}
LOG_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] (.*)$")


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
        self.assertIn("keel: error: 'trian': unknown command; hint: did you mean 'train'?", err)
        rc, _, err = keel("train")
        self.assertEqual(rc, 2)
        self.assertIn("needs a MANIFEST", err)

    def test_usage_error_is_short(self):
        # One error line and one usage line, not the whole help.
        for args in (["trian"], ["train"], ["validate", "m.toml", "--sett", "x"], ["--verison"]):
            rc, out, err = keel(*args)
            self.assertEqual(rc, 2, args)
            lines = err.splitlines()
            self.assertEqual(len(lines), 2, err)
            self.assertTrue(lines[0].startswith("keel: error: "), err)
            self.assertTrue(lines[1].startswith("usage: keel "), err)
            self.assertEqual(out, "")

    def test_did_you_mean_for_flags(self):
        rc, _, err = keel("train", f"{ROOT}/configs/quickstart.toml", "--sett", "x=1")
        self.assert_one_error_line(rc, err, "--sett: unknown flag", "did you mean '--set'?")
        self.assertEqual(rc, 2)
        rc, _, err = keel("--verison")
        self.assert_one_error_line(rc, err, "--verison: unknown flag", "did you mean '--version'?")
        rc, _, err = keel("validate", f"{ROOT}/configs/quickstart.toml", "--log-lvl", "debug")
        self.assert_one_error_line(rc, err, "--log-lvl", "did you mean '--log-level'?")
        rc, _, err = keel("plugins", "shwo")
        self.assert_one_error_line(rc, err, "shwo", "did you mean 'show'?")

    def test_bad_log_level(self):
        rc, _, err = keel("validate", f"{ROOT}/configs/quickstart.toml", "--log-level", "loud")
        self.assertEqual(rc, 2)
        self.assert_one_error_line(rc, err, "--log-level loud: not a log level",
                                   "trace, debug, info, warn, error, off")
        rc, _, err = keel("validate", f"{ROOT}/configs/quickstart.toml",
                          env={"KEEL_LOG_LEVEL": "debgu"})
        self.assertEqual(rc, 2)
        self.assert_one_error_line(rc, err, "KEEL_LOG_LEVEL=debgu: not a log level",
                                   "did you mean 'debug'?")
        # The flag wins over the environment: a bad KEEL_LOG_LEVEL is then not even read.
        rc, _, err = keel("validate", f"{ROOT}/configs/quickstart.toml", "--log-level", "info",
                          env={"KEEL_LOG_LEVEL": "loud"})
        self.assertEqual(rc, 0, err)

    def test_plugins_show_of_a_kernel_table_points_to_options(self):
        rc, _, err = keel("plugins", "show", "train")
        self.assert_one_error_line(rc, err, "[train] is a kernel table", "`keel options train`")
        self.assertEqual(rc, 1)
        rc, _, err = keel("options", "trian")
        self.assert_one_error_line(rc, err, "no kernel table named 'trian'",
                                   "did you mean 'train'?")
        self.assertEqual(rc, 1)
        rc, _, err = keel("options", "optimizer")
        self.assert_one_error_line(rc, err, "keel plugins show", "adamw")


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

    def test_help_lists_every_command_and_flag(self):
        rc, out, err = keel("--help")
        self.assertEqual(rc, 0, err)
        for command in ["train", "evaluate", "validate", "plugins", "options"]:
            self.assertRegex(out, rf"\n  {command} ", command)
        for flag in FLAGS[None]:
            self.assertIn(flag, out)
        self.assertIn("KEEL_LOG_LEVEL", out)
        for command in [c for c in FLAGS if c]:
            for form in ([command, "--help"], [command, "-h"], ["help", command]):
                rc, out, err = keel(*form)
                self.assertEqual(rc, 0, err)
                self.assertTrue(out.startswith(f"usage: keel {command}"), out)
                for flag in FLAGS[command]:
                    self.assertIn(flag, out, form)
                if "--set" not in FLAGS[command]:
                    self.assertNotIn("--set", out)

    def test_options_documents_kernel_tables(self):
        rc, out, err = keel("options")
        self.assertEqual(rc, 0, err)
        for table in ["[run]", "[train]", "[checkpoint]", "[[hooks]]", "[[optimizer.groups]]",
                      "[plugins]"]:
            self.assertIn(table + "  (kernel)", out)
        for key in ["output_dir", "grad_accum", "every_steps", "priority", "params", "paths"]:
            self.assertRegex(out, rf"\n  {key} +\S")
        rc, out, err = keel("options", "train")
        self.assertEqual(rc, 0, err)
        self.assertTrue(out.startswith("[train]  (kernel)"), out)
        self.assertIn("max_steps", out)
        self.assertRegex(out, r"epochs +integer in \[0, 1e\+09\] +default 1 ")
        self.assertNotIn("[run]", out)
        rc, out2, _ = keel("options", "[train]")
        self.assertEqual((rc, out2), (0, out))

    def test_log_level(self):
        m = f"{ROOT}/configs/quickstart.toml"
        rc, out, err = keel("validate", m)
        self.assertEqual(rc, 0, err)
        self.assertNotIn("command line:", out)
        for args, env in [(["--log-level", "debug"], None), (["--log-level=trace"], None),
                          ([], {"KEEL_LOG_LEVEL": "debug"})]:
            rc, out, err = keel("validate", m, *args, env=env)
            self.assertEqual(rc, 0, err)
            self.assertIn("command line:", out, (args, env))
        # Before the command too; and the flag wins over KEEL_LOG_LEVEL.
        rc, out, err = keel("--log-level", "debug", "validate", m)
        self.assertIn("command line:", out)
        rc, out, err = keel("validate", m, "--log-level", "info", env={"KEEL_LOG_LEVEL": "debug"})
        self.assertEqual(rc, 0, err)
        self.assertNotIn("command line:", out)

    def test_run_log(self):
        with tempfile.TemporaryDirectory() as d:
            rc, out, err = keel("train", f"{ROOT}/configs/quickstart.toml", "--set",
                                "data.train.limit=256", "--set", "data.test.limit=100",
                                "--set", "train.epochs=1", "--set", f"run.output_dir={d}/run")
            self.assertEqual(rc, 0, err)
            with open(f"{d}/run/run.log") as f:
                log = f.read()
            # Everything the console showed ...
            shown = [LOG_LINE.match(line).group(1) for line in out.splitlines()
                     if LOG_LINE.match(line)]
            self.assertTrue(any(s.startswith("done: ") for s in shown), out)
            for message in shown:
                self.assertIn(message, log)
            # ... plus debug detail the console did not show.
            debug = [line for line in log.splitlines() if "] [debug] " in line]
            self.assertTrue(debug, log)
            self.assertTrue(any("command line: " in line for line in debug), log)
            for line in debug:
                self.assertNotIn(line.split("] [debug] ", 1)[1], out)
            # --log-level error: the console shows nothing, run.log still has the detail.
            rc, out, err = keel("train", f"{ROOT}/configs/quickstart.toml", "--set",
                                "data.train.limit=256", "--set", "data.test.limit=100",
                                "--set", "train.epochs=1", "--set", f"run.output_dir={d}/quiet",
                                "--set", "hooks[0].progress=never", "--log-level", "error")
            self.assertEqual(rc, 0, err)
            self.assertEqual(out, "")
            with open(f"{d}/quiet/run.log") as f:
                log = f.read()
            self.assertIn("] [info] done: ", log)
            self.assertIn("] [debug] ", log)

    def test_version(self):
        rc, out, _ = keel("--version")
        self.assertEqual(rc, 0)
        self.assertRegex(out, r"keel \d+\.\d+\.\d+ \(plugin ABI 1\.\d+, LibTorch ")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
