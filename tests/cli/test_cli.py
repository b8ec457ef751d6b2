"""CLI behaviour on good and bad input: one clear error line, a non-zero exit, no abort and
no stack trace; run directories (another user's symlinks, failed starts beside other runs).

The keel command lines run in-process: keel_inproc (tests/cli/keel_inproc.cpp, driven by
tests/cli/inproc.py) calls keel::cli_main, the function the `keel` executable runs, for each, in
one long-lived process, and a case that leaves process-global state changed fails (a leak); the
runner must exit 0 at the end (under the sanitizers: LeakSanitizer's report). Keel processes
remain where the process is the point: the BLAS loaded by path whatever LD_LIBRARY_PATH says (the
dynamic loader reads it at start-up) and the mapped files of a running keel (test_blas_by_path),
and a run whose start waits, in a process of its own, while another run trains
(test_failed_start_keeps_other_runs_work), and a run on a terminal (a pseudo-terminal:
test_progress_line_on_a_terminal_only).
Usage: test_cli.py KEEL_BINARY SOURCE_ROOT MISBEHAVE_FIXTURE_DIR KEEL_INPROC"""
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Optional

import inproc

KEEL, ROOT = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
FIXTURES, INPROC = os.path.abspath(sys.argv[3]), os.path.abspath(sys.argv[4])
TIMEOUT_S = 120
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# The directory of the BLAS keel's executables load by path (meson.build, option blas_dir; ""
# when none), and the reference BLAS's directory beside it (Debian: libblas3).
BLAS_DIR = os.environ.get("KEEL_BLAS_DIR", "")
REFERENCE_BLAS_DIR = os.path.join(os.path.dirname(BLAS_DIR), "blas")


POOL: Optional[inproc.Pool] = None  # the keel_inproc runner, while the tests run


def setUpModule():
    global POOL
    POOL = inproc.Pool(INPROC, TIMEOUT_S,
                       env={k: v for k, v in os.environ.items() if k != "KEEL_LOG_LEVEL"})


def tearDownModule():
    problems = POOL.close()
    if problems:  # (under the sanitizers: a leak LeakSanitizer reported at the runner's exit)
        raise AssertionError("keel_inproc did not exit clean:\n" + "\n".join(problems))


def keel(*args, cwd=None, env=None, argv0="keel"):
    """keel ARGS in keel_inproc, in cwd (default: ours), with the environment without
    KEEL_LOG_LEVEL plus env; fails when it hangs or leaves process-global state changed.
    argv0: the program name it gets (default "keel", as a shell finds keel on PATH: the
    commands messages name to run are "keel ..."; Program tests other names)."""
    return POOL.keel([argv0, *args], cwd=cwd or os.getcwd(), env=env, unset=["KEEL_LOG_LEVEL"])


def keel_process(*args, cwd=None, env=None):
    """keel ARGS as a process of its own, with the environment without KEEL_LOG_LEVEL plus env."""
    full_env = {k: v for k, v in os.environ.items() if k != "KEEL_LOG_LEVEL"}
    full_env.update(env or {})
    p = subprocess.run([KEEL, *args], capture_output=True, text=True, cwd=cwd,
                       timeout=TIMEOUT_S, env=full_env)
    return p.returncode, p.stdout, p.stderr


# Every flag of each command, as `keel COMMAND --help` must list it.
FLAGS = {
    None: ["--set", "--log-level", "--help", "-h", "--version"],
    "train": ["--set", "--log-level", "--help", "--resume", "--overwrite"],
    "evaluate": ["--set", "--log-level", "--help"],
    "validate": ["--set", "--log-level", "--help", "--resume", "--overwrite"],
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

    def test_messages_name_keel_as_it_was_run(self):
        # The commands messages tell the user to run (usage lines, help, hints) name keel as it
        # was run (argv[0]), quoted for the shell where it must be; the names of what failed
        # ("keel: error:", "keel plugins show NAME:") stay keel's.
        for argv0, shown in (("build/kernel/keel", "build/kernel/keel"),
                             ("/opt/my keel/keel", "'/opt/my keel/keel'"), ("keel", "keel")):
            rc, out, err = keel("trian", argv0=argv0)
            self.assertEqual(rc, 2, err)
            self.assertEqual(err.splitlines()[1],
                             f"usage: {shown} COMMAND [ARGS] [FLAGS], COMMAND one of train, "
                             f"evaluate, export, validate, plugins, options, prepare, report, help"
                             f"  (`{shown} --help` for more)")
            rc, _, err = keel("plugins", "show", "train", argv0=argv0)
            self.assert_one_error_line(rc, err, "keel plugins show train: ",
                                       f"hint: [train] is a kernel table: `{shown} options train`")
            rc, out, err = keel("--help", argv0=argv0)
            self.assertIn(f"\nusage: {shown} COMMAND [ARGS] [FLAGS]\n", out)
            self.assertIn(f"`{shown} COMMAND --help`", out)
            for line in out.splitlines():  # wrapped with the name in it
                self.assertLessEqual(len(line), 100, line)
            rc, out, err = keel("options", "--help", argv0=argv0)
            self.assertTrue(out.startswith(f"usage: {shown} options [TABLE]"), out)
            rc, out, err = keel("options", "hooks", argv0=argv0)
            self.assertIn(f"`{shown} plugins show console`", out)

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

    def test_tables_size_their_columns_to_their_content(self):
        # Each table's header or first row gives where its columns start: every other row has
        # two spaces before each of them and a cell starting there, however long the names
        # (token_cross_entropy, keel-torch-checkpoint).
        cases = [  # (command, the table's first line, a cell it must hold)
            (["plugins"], lambda l: l.startswith("KIND "), "token_cross_entropy"),
            (["plugins"], lambda l: l.startswith("KIND "), "keel-torch-checkpoint"),
            (["plugins", "show", "adamw"], lambda l: l.startswith("  lr "), "weight_decay"),
            (["options", "checkpoint"], lambda l: re.match(r"^  \S+  ", l),
             "init_from_unverified"),
        ]
        outputs = {}
        for args, first, cell in cases:
            with self.subTest(args=args, cell=cell):
                if tuple(args) not in outputs:
                    outputs[tuple(args)] = keel(*args)
                rc, out, err = outputs[tuple(args)]
                self.assertEqual(rc, 0, err)
                lines = out.splitlines()
                start = next(i for i, l in enumerate(lines) if first(l))
                rows = []
                for l in lines[start:]:
                    if not l.strip() or l.startswith("  ("):  # the table's end, or a note
                        break
                    rows.append(l)
                self.assertTrue(any(cell in r.split() for r in rows), rows)
                head = rows[0]
                starts = [m.start() for m in re.finditer(r"(?<=  )\S", head)]
                self.assertGreaterEqual(len(starts), 3, head)
                for r in rows[1:]:
                    for p in starts:
                        self.assertEqual(r[p - 2:p], "  ", (r, p))
                        self.assertNotEqual(r[p:p + 1], " ", (r, p))

    def test_help_keeps_each_command_line_in_its_columns(self):
        # keel --help: every command's summary starts in one column, after the widest
        # "command operands" head (prepare INPUT --output DIR), and wraps into that column;
        # no line is longer than 100 characters.
        rc, out, err = keel("--help")
        self.assertEqual(rc, 0, err)
        lines = out.split("commands:\n")[1].split("\n\n")[0].splitlines()
        heads = {}
        column = None
        for l in lines:
            self.assertLessEqual(len(l), 100, l)
            m = re.match(r"^  (\S+(?: \S+)*)  +(\S.*)$", l)
            if m and not l.startswith("   "):
                heads[m.group(1).split()[0]] = m.group(1)
                self.assertIn(column, (None, m.start(2)), l)
                column = m.start(2)
            else:  # a summary's continuation
                self.assertIsNotNone(column, l)
                self.assertEqual(len(l) - len(l.lstrip()), column, l)
        self.assertEqual(heads.get("prepare"), "prepare INPUT --output DIR")
        self.assertEqual(heads.get("plugins"), "plugins [show NAME]")
        self.assertEqual(heads.get("export"), "export RUN_DIR|CHECKPOINT")
        self.assertEqual(set(heads), {"train", "evaluate", "export", "validate", "plugins",
                                      "options", "prepare", "report", "help"})
        for l in out.splitlines():
            self.assertLessEqual(len(l), 100, l)

    def test_plugins_show_lists_options(self):
        rc, out, _ = keel("plugins", "show", "adamw")
        self.assertEqual(rc, 0)
        self.assertIn("weight_decay", out)
        self.assertIn("default 0.01", out)
        # The range shown is the one validation enforces (beta1 = 1 fails there, located:
        # test_bad_input.py's range_beta1_one).
        self.assertRegex(out, r"beta1 +float in \[0, 1\) ")
        rc, _, err = keel("plugins", "show", "adamww")
        self.assertEqual(rc, 1)
        self.assertIn("did you mean 'adamw'?", err)

    def test_train_then_evaluate_the_checkpoint(self):
        # The sequence: train, then evaluate the checkpoint with the same manifest, so
        # into the same run directory. evaluate writes into a directory of its own inside it
        # and leaves the training run's files byte for byte as they were; a second train of the
        # manifest is refused, --resume continues, --overwrite starts over (run.log appended).
        with tempfile.TemporaryDirectory() as d:
            run = f"{d}/run"
            common = [f"{ROOT}/configs/quickstart.toml", "--set", "data.train.limit=2048",
                      "--set", "data.test.limit=1000", "--set", "lr_scheduler.warmup_steps=5",
                      "--set", f"run.output_dir={run}"]
            rc, _, err = keel("train", *common, "--set", "train.max_steps=40")
            self.assertEqual(rc, 0, err)
            with open(f"{run}/metrics.jsonl") as f:
                trained = [json.loads(line) for line in f]
            final = trained[-1]
            self.assertEqual(final["split"], "test")
            names = ["metrics.jsonl", "manifest.resolved.toml", "plugins.json", "run.log"]

            def contents():
                out = {}
                for n in names:
                    with open(f"{run}/{n}", "rb") as f:
                        out[n] = f.read()
                return out

            before = contents()
            rc, out, err = keel("evaluate", *common,
                                "--set", f"checkpoint.init_from={run}/checkpoints/step-40")
            self.assertEqual(rc, 0, err)
            self.assertEqual(contents(), before, "evaluate changed the training run's files")
            evals = [e for e in os.listdir(run) if e.startswith("eval-")]
            self.assertEqual(len(evals), 1, os.listdir(run))
            eval_dir = f"{run}/{evals[0]}"
            self.assertRegex(evals[0], r"^eval-\d{8}T\d{6}Z$")
            self.assertIn(f"run directory {eval_dir}\n", out)  # it says where it wrote
            self.assertEqual(sorted(os.listdir(eval_dir)), sorted(names))
            with open(f"{eval_dir}/metrics.jsonl") as f:
                records = [json.loads(line) for line in f]
            self.assertEqual([r["split"] for r in records], ["test"])
            self.assertEqual(records[0]["accuracy"], final["accuracy"])
            self.assertAlmostEqual(records[0]["loss"], final["loss"], places=6)
            # The record is the checkpoint's: its step and epoch, those of the training run's
            # evaluation of the same weights (not step 0, epoch 0).
            self.assertEqual((records[0]["step"], records[0]["epoch"]), (40, final["epoch"]))
            self.assertEqual(final["step"], 40)
            # A second evaluation gets a directory of its own too.
            rc, out, err = keel("evaluate", *common,
                                "--set", f"checkpoint.init_from={run}/checkpoints/step-40")
            self.assertEqual(rc, 0, err)
            self.assertEqual(len([e for e in os.listdir(run) if e.startswith("eval-")]), 2)
            self.assertEqual(contents(), before)

            # train again without --resume: refused, one line, nothing changed; validate
            # refuses it with the same line (it checks what train does before step 1), and
            # with train's flags says ok where train would start, changing nothing either.
            rc, _, err = keel("train", *common, "--set", "train.max_steps=40")
            self.assertEqual(rc, 1)
            self.assertEqual(len(err.splitlines()), 1, err)
            self.assertIn(f"run directory {run} holds an earlier run's records", err)
            self.assertIn("hint: continue that run with --resume", err)
            self.assertIn("--overwrite", err)
            self.assertEqual(contents(), before)
            rc, _, verr = keel("validate", *common, "--set", "train.max_steps=40")
            self.assertEqual((rc, verr), (1, err))
            listing = sorted(os.listdir(run))
            for flags in (["--overwrite"], ["--resume"], ["--resume", f"{run}/checkpoints/step-40"]):
                rc, out, verr = keel("validate", *common, "--set", "train.max_steps=45", *flags)
                self.assertEqual(rc, 0, verr)
                self.assertIn(": ok (run ", out)
            self.assertIn(f"would resume from {run}/checkpoints/step-40 (step 40", out + verr)
            # A manifest change that breaks the continuation: refused by both, the same line.
            changed = [*common, "--set", "model.hidden=[17]", "--resume"]
            rc, _, err = keel("train", *changed)
            self.assertEqual(rc, 1)
            self.assertIn("--resume: model.hidden changed since the checkpoint", err)
            rc, _, verr = keel("validate", *changed)
            self.assertEqual((rc, verr), (1, err))
            self.assertEqual((contents(), sorted(os.listdir(run))), (before, listing))
            # --resume continues it: the records up to step 40 stay, run.log is appended to.
            rc, _, err = keel("train", *common, "--set", "train.max_steps=45", "--resume")
            self.assertEqual(rc, 0, err)
            with open(f"{run}/metrics.jsonl") as f:
                resumed = [json.loads(line) for line in f]
            self.assertEqual(resumed[:len(trained)], trained)
            self.assertEqual(resumed[-1]["step"], 45)
            with open(f"{run}/run.log", "rb") as f:
                log = f.read()
            self.assertTrue(log.startswith(before["run.log"]))
            self.assertEqual(log.count(b"===== keel train, run "), 2)
            # --overwrite starts a new run there: new records, run.log still appended to.
            rc, _, err = keel("train", *common, "--set", "train.max_steps=5", "--overwrite")
            self.assertEqual(rc, 0, err)
            with open(f"{run}/metrics.jsonl") as f:
                self.assertEqual(json.loads(f.readline())["step"], 5)
            with open(f"{run}/run.log", "rb") as f:
                self.assertTrue(f.read().startswith(log))
            rc, _, err = keel("train", *common, "--resume", "--overwrite")
            self.assertEqual(rc, 2)
            self.assertIn("--overwrite and --resume", err)

            # Without init_from, evaluate takes the run's newest verified checkpoint (by commit
            # time, as --resume does) and says which: here step-45, since the --overwrite run's
            # step-5, committed last, is damaged and skipped.
            with open(f"{run}/checkpoints/step-5/model.safetensors", "ab") as f:
                f.write(b"x")
            rc, out, err = keel("evaluate", *common)
            self.assertEqual(rc, 0, err)
            said = [l for l in (out + err).splitlines()
                    if "the newest verified checkpoint of the run" in l]
            self.assertEqual(len(said), 1, out + err)
            self.assertIn(f"evaluating {run}/checkpoints/step-45 (step 45)", said[0])
            self.assertIn(f"skipping {run}/checkpoints/step-5", out + err)
            newest = max((e for e in os.listdir(run) if e.startswith("eval-")),
                         key=lambda e: os.path.getmtime(f"{run}/{e}"))
            with open(f"{run}/{newest}/manifest.resolved.toml") as f:
                self.assertRegex(f.read(), rf"\ninit_from = ['\"]{run}/checkpoints/step-45['\"]\n")
            # With no verified checkpoint it refuses, and says what to do instead.
            rc, out, err = keel("evaluate", *common[:-1], f"run.output_dir={d}/empty")
            self.assertEqual(len(err.splitlines()), 1, err)
            for part in ("keel: error: ", "nothing to evaluate",
                         "[checkpoint] init_from is not set",
                         f"{d}/empty/checkpoints holds no verified checkpoint",
                         "--set checkpoint.init_from=DIR",
                         f"keel train {ROOT}/configs/quickstart.toml"):
                self.assertIn(part, err)
            self.assertEqual(rc, 1)
            self.assertFalse(os.path.exists(f"{d}/empty/checkpoints"))
            # A checkpoint saved at an epoch's end (trainer_state.toml's epoch: the next one):
            # the evaluation's record has the epoch of the training run's at that step.
            at_end = [*common[:-1], f"run.output_dir={d}/epoch"]
            rc, _, err = keel("train", *at_end, "--set", "train.epochs=1")
            self.assertEqual(rc, 0, err)
            rc, _, err = keel("evaluate", *at_end)
            self.assertEqual(rc, 0, err)
            with open(f"{d}/epoch/metrics.jsonl") as f:
                trained = [json.loads(line) for line in f][-1]
            (eval_dir,) = [e for e in os.listdir(f"{d}/epoch") if e.startswith("eval-")]
            with open(f"{d}/epoch/{eval_dir}/metrics.jsonl") as f:
                (record,) = [json.loads(line) for line in f]
            self.assertEqual((trained["split"], trained["step"], trained["epoch"]), ("test", 32, 0))
            self.assertEqual((record["step"], record["epoch"]), (32, 0))

    def test_help_lists_every_flag_of_train(self):
        # keel --help lists every flag train takes, as `keel train --help` lists them (from
        # train's flags table, add_train_flags) and as the usage line writes them
        # ("--resume [PATH]"), in keel's own format: "-h, --help", not program_options'
        # "-h [ --help ]".
        rc, main_help, err = keel("--help")
        self.assertEqual(rc, 0, err)
        rc, train_help, err = keel("train", "--help")
        self.assertEqual(rc, 0, err)
        usage = train_help.splitlines()[0]
        heads = re.findall(r"^  (-\S.*?)(?:  +|$)", train_help.split("\nflags:\n")[1], re.M)
        self.assertIn("--resume [PATH]", heads)
        self.assertIn("--overwrite", heads)
        self.assertIn("-h, --help", heads)
        for head in heads:
            self.assertRegex(main_help, rf"\n  {re.escape(head)}  ", head)
            if head != "-h, --help":
                self.assertIn(f"[{head}]", usage)
        for text in (main_help, train_help):
            self.assertNotIn("[ --", text)

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
            # The done line gives the process's peak resident memory (getrusage's ru_maxrss).
            done = [s for s in shown if s.startswith("done: ")][0]
            rss = re.search(r"^done: \d+ steps, \d+ samples, peak RSS (\d+\.\d) MiB, run ", done)
            self.assertTrue(rss, done)
            self.assertGreater(float(rss.group(1)), 0, done)
            for message in shown:
                self.assertIn(message, log)
            # ... plus debug detail the console did not show.
            debug = [line for line in log.splitlines() if "] [debug] " in line]
            self.assertTrue(debug, log)
            self.assertTrue(any("command line: " in line for line in debug), log)
            # Near the top: the threads and the BLAS the run runs on (kernel/blas.hpp), the
            # OpenMP build from its directory when meson found it (KEEL_BLAS_DIR).
            blas = [line for line in debug if "LibTorch intra-op thread(s)" in line]
            self.assertEqual(len(blas), 1, log)
            self.assertRegex(blas[0], r"; BLAS: .*, \d+ threads?$")
            if BLAS_DIR:
                self.assertRegex(blas[0], rf"; BLAS: OpenBLAS [\d.]+ \(OpenMP build, "
                                          rf"{re.escape(BLAS_DIR)}/libblas\.so\.3\), "
                                          rf"{os.cpu_count()} threads?$")
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

    def test_progress_line_on_a_terminal_only(self):
        # On a terminal (here a pseudo-terminal, so keel runs as a process of its own) the
        # console hook draws a live progress line from the start of training, rewritten in
        # place ("\r\033[K" + frame + "\r") and cleared by every log line; run.log holds none.
        with tempfile.TemporaryDirectory() as d:
            args = small_args(f"{d}/tty", steps=8)
            master, slave = pty.openpty()
            env = {k: v for k, v in os.environ.items() if k != "KEEL_LOG_LEVEL"}
            p = subprocess.Popen([KEEL, "train", *args], stdin=slave, stdout=slave,
                                 stderr=slave, env=env)
            os.close(slave)
            chunks, deadline = [], time.monotonic() + TIMEOUT_S
            try:
                while time.monotonic() < deadline:
                    if not select.select([master], [], [], 1)[0]:
                        continue
                    try:
                        data = os.read(master, 65536)
                    except OSError:  # EIO: the terminal's last writer exited
                        break
                    if not data:
                        break
                    chunks.append(data)
            finally:
                os.close(master)
                if p.poll() is None:
                    p.kill()
            self.assertEqual(p.wait(), 0)
            out = b"".join(chunks).decode()
            frames = re.findall(r"\r\x1b\[K(\[[#.]{20}\] \d+/8 \d+% \| \d+:\d\d elapsed "
                                r"\| [^\r\n]*)\r", out)
            self.assertTrue(frames, repr(out))
            self.assertTrue(frames[0].startswith("[....................] 0/8 0% | 0:00 elapsed"),
                            frames)  # drawn before the first step
            self.assertTrue(any(f.startswith("[####################] 8/8 100% | ") and "| ETA "
                                in f for f in frames), frames)
            # Every log line first clears the line the frame is on.
            lines = [m.start() for m in re.finditer(r"\[\d\d:\d\d:\d\d\] ", out)]
            self.assertTrue(any(out[i:].startswith(out[i:i + 11] + "done: ") for i in lines))
            for i in lines:
                self.assertEqual(out[i - 4:i], "\r\x1b[K", repr(out[max(0, i - 80):i + 40]))
            with open(f"{d}/tty/run.log") as f:
                log = f.read()
            self.assertIn("] [info] done: ", log)
            for text in ("elapsed", "\x1b", "\r"):
                self.assertNotIn(text, log)
            # Without a terminal (keel_inproc's output is a file) nothing of it is printed.
            rc, out, err = keel("train", *small_args(f"{d}/file", steps=8))
            self.assertEqual(rc, 0, err)
            self.assertRegex(out, r"\] step 8/8 ")
            for text in ("elapsed", "\x1b", "\r", "ETA 0:00 |"):
                self.assertNotIn(text, out + err)

    def test_version(self):
        rc, out, _ = keel("--version")
        self.assertEqual(rc, 0)
        self.assertRegex(out, r"keel \d+\.\d+\.\d+ \(plugin ABI 1\.\d+, LibTorch ")
        cores = os.cpu_count()
        self.assertRegex(out.splitlines()[1], r"^BLAS: .*, (\d+ threads?|threads left as they "
                         rf"are) in a run with \[run\] threads = 0 \({cores} cores?\)$")

    @unittest.skipUnless(BLAS_DIR, "keel is built without -Dblas_dir (no OpenBLAS OpenMP build)")
    def test_blas_by_path(self):
        # keel loads OpenBLAS's OpenMP build from its directory (DT_RPATH, meson.build), whatever
        # the machine's BLAS alternatives select: here even with the reference BLAS first on
        # LD_LIBRARY_PATH, which programs without that RPATH take.
        env = {"LD_LIBRARY_PATH": REFERENCE_BLAS_DIR}
        rc, out, err = keel_process("--version", env=env)
        self.assertEqual(rc, 0, err)
        self.assertRegex(out, rf"\nBLAS: OpenBLAS [\d.]+ \(OpenMP build, {re.escape(BLAS_DIR)}/"
                              rf"libblas\.so\.3\), {os.cpu_count()} threads? in a run")
        # The mapped files of a running keel (blocked opening a FIFO as its manifest).
        with tempfile.TemporaryDirectory() as d:
            fifo = os.path.join(d, "m.toml")
            os.mkfifo(fifo)
            p = subprocess.Popen([KEEL, "validate", fifo], env=dict(os.environ, **env),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                deadline, maps = time.monotonic() + 60, ""
                while "libtorch_cpu" not in maps and time.monotonic() < deadline:
                    time.sleep(0.05)
                    with open(f"/proc/{p.pid}/maps") as f:
                        maps = f.read()
            finally:
                p.kill()
                p.wait()
        mapped = {line.split()[-1] for line in maps.splitlines() if "/" in line}
        blas = {m for m in mapped if re.search(r"/lib(blas|lapack|openblas)[.\w-]*\.so", m)}
        self.assertTrue(blas, maps)
        for m in blas:
            self.assertEqual(os.path.dirname(m), os.path.realpath(BLAS_DIR), blas)


def small_args(output_dir, steps=2):
    """A quickstart run of `steps` steps on 256 samples into `output_dir`."""
    return [f"{ROOT}/configs/quickstart.toml", "--set", "data.train.limit=256", "--set",
            "data.test.limit=64", "--set", f"train.max_steps={steps}", "--set", "run.threads=1",
            "--set", f"run.output_dir={output_dir}"]


def tree(root):
    """{relative path: file bytes (None for a directory)} under `root`."""
    out = {}
    for base, dirs, files in os.walk(root):
        for n in dirs:
            out[os.path.relpath(os.path.join(base, n), root)] = None
        for n in files:
            with open(os.path.join(base, n), "rb") as f:
                out[os.path.relpath(os.path.join(base, n), root)] = f.read()
    return out


class RunDirectories(unittest.TestCase):
    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"),
                         "needs root (the victim) and setpriv (the other user)")
    def test_another_users_directory_and_symlinks_are_refused(self):
        # The other user (uid 65534) prepares run directories under a shared sticky directory,
        # with symlinks named like the files a run writes, pointing at the victim's files and
        # into a 0700 directory of the victim's. keel refuses each one (one line and a hint)
        # and writes nothing through them.
        with tempfile.TemporaryDirectory() as d:
            os.chmod(d, 0o755)
            shared, private, victim = f"{d}/shared", f"{d}/private", f"{d}/victim.txt"
            os.mkdir(shared)
            os.chmod(shared, 0o1777)
            os.mkdir(private, 0o700)
            with open(victim, "w") as f:
                f.write("secret\n")
            os.chmod(victim, 0o600)
            links = (f"ln -s {victim} manifest.resolved.toml && ln -s {private}/new.json "
                     f"plugins.json && ln -s {victim} run.log")
            subprocess.run(NOBODY + ["sh", "-ec",
                                     f"cd {shared} && mkdir -m 777 runs runs/exp exp2 && "
                                     f"(cd runs/exp && {links}) && (cd exp2 && {links}) && "
                                     f"chmod 755 exp2 && ln -s {private} exp3"], check=True)
            own = f"{d}/own"  # the victim's own directory, a symlink named run.log in it
            os.mkdir(own)
            os.symlink(victim, f"{own}/run.log")
            cases = [
                (f"{shared}/runs/exp", f"{shared}/runs on the way to it belongs to another user "
                                       "(uid 65534)"),
                (f"{shared}/runs/new", f"{shared}/runs on the way to it belongs to another user"),
                (f"{shared}/exp2", f"run directory {shared}/exp2 belongs to another user "
                                   "(uid 65534)"),
                (f"{shared}/exp3", f"run directory {shared}/exp3 is a symbolic link"),
                (own, f"{own}/run.log is a symbolic link; keel does not write through symlinks"),
            ]
            for output_dir, expected in cases:
                with self.subTest(output_dir=output_dir):
                    rc, _, err = keel("train", *small_args(output_dir))
                    self.assertEqual(rc, 1, err)
                    self.assertEqual(len(err.splitlines()), 1, err)
                    self.assertIn(expected, err)
                    self.assertIn("; hint: ", err)
                    with open(victim) as f:
                        self.assertEqual(f.read(), "secret\n")
                    self.assertEqual(os.listdir(private), [])
            self.assertEqual(sorted(os.listdir(own)), ["run.log"])  # what the failed start made went
            self.assertEqual(sorted(os.listdir(f"{shared}/runs")), ["exp"])
            # A new directory of ours in the shared sticky directory is fine.
            rc, _, err = keel("train", *small_args(f"{shared}/mine"))
            self.assertEqual(rc, 0, err)
            self.assertEqual(os.stat(f"{shared}/mine").st_mode & 0o022, 0)

    def failing_args(self, output_dir, release):
        """The arguments of `keel train` into `output_dir` whose start fails once file `release`
        exists (a misbehave hook waits for it in its constructor)."""
        manifest = os.path.join(os.path.dirname(release), "failing.toml")
        with open(manifest, "w") as f:
            f.write(f'''extends = "{ROOT}/configs/quickstart.toml"
[plugins]
paths = ["{FIXTURES}"]
[[hooks]]
type = "mbx_hook"
fault = "ctor_throw_after"
wait_for = "{release}"
''')
        args = small_args(output_dir)
        args[0] = manifest
        return args

    def start_failing(self, output_dir, release, *flags):
        """`keel train` into `output_dir` whose start fails once file `release` exists, as a
        process of its own. Returns the process once it created `output_dir` (at once when
        `release` exists already)."""
        args = self.failing_args(output_dir, release)
        p = subprocess.Popen([KEEL, "train", *args, *flags], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        if os.path.exists(release):
            return p
        for _ in range(600):
            if os.path.isdir(output_dir) or p.poll() is not None:
                break
            time.sleep(0.05)
        if not os.path.isdir(output_dir):
            p.kill()
            self.fail(f"keel did not create {output_dir}: {p.communicate()}")
        return p

    def test_failed_start_keeps_other_runs_work(self):
        # Run A starts into a directory that does not exist yet and fails during its start;
        # meanwhile run B trained into a sibling in the same new parent (a sweep), or into the
        # same directory (--overwrite), and committed a checkpoint. A removes only what it
        # created itself: B's run directory and files stay, byte for byte.
        for case in ("sweep", "same directory"):
            with self.subTest(case), tempfile.TemporaryDirectory() as d:
                release = f"{d}/release"
                if case == "sweep":
                    a_dir, b_dir, b_flags = f"{d}/sweep/lr-0.1", f"{d}/sweep/lr-0.3", []
                else:
                    a_dir, b_dir, b_flags = f"{d}/run", f"{d}/run", ["--overwrite"]
                a = self.start_failing(a_dir, release)
                try:
                    rc, _, err = keel("train", *small_args(b_dir), *b_flags)
                    self.assertEqual(rc, 0, err)
                    b_files = tree(b_dir)
                    self.assertIn("checkpoints/step-2/commit.json", b_files)
                    self.assertIn("metrics.jsonl", b_files)
                finally:
                    open(release, "w").close()
                    _, a_err = a.communicate(timeout=120)
                self.assertEqual(a.returncode, 1, a_err)
                self.assertIn("deliberate failure in the constructor", a_err)
                self.assertNotIn("left behind", a_err)
                self.assertEqual(tree(b_dir), b_files)
                if case == "sweep":
                    self.assertEqual(os.listdir(f"{d}/sweep"), ["lr-0.3"])  # A's own went

    def test_failed_start_removes_what_it_created(self):
        # Nobody else involved: a failed start into a missing parent removes both directories
        # it created; into an existing directory it leaves that directory's entries as they were.
        with tempfile.TemporaryDirectory() as d:
            release = f"{d}/release"
            open(release, "w").close()
            rc, _, err = keel("train", *self.failing_args(f"{d}/new/run", release))
            self.assertEqual(rc, 1, err)
            self.assertEqual(sorted(os.listdir(d)), ["failing.toml", "release"])
            os.makedirs(f"{d}/old")
            with open(f"{d}/old/keep.txt", "w") as f:
                f.write("kept\n")
            rc, _, err = keel("train", *self.failing_args(f"{d}/old", release))
            self.assertEqual(rc, 1, err)
            self.assertEqual(tree(f"{d}/old"), {"keep.txt": b"kept\n"})


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
