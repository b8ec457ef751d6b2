"""The GPU check's tools (docs/gpu-check.md), without a GPU and without packing: the search-path
rewrite that tools/gpu_check/pack.sh applies to keel and its plugins, the judge that decides
each PASS or FAIL line of tools/gpu_check/run.sh, and run.sh's refusals before any check runs.

- set_runpath.py on a copy of this build's keel: the RPATH becomes `$ORIGIN/../lib` and nothing
  else readelf shows of the file changes, and the copy still runs `--version` (with this build's
  LibTorch on LD_LIBRARY_PATH, as run.sh sets it); a path longer than the old one, a file with
  no such entry and a file that is not ELF are one error line each, with the file unchanged.
- judge.py on written metrics.jsonl and run.log files, table-driven: every verdict of each kind
  (quickstart, lm with and without a process group line, mfu, resume, ctr with the tables' rows
  as tensors on the device or not) passes where it should and fails with the reason where it
  should.
- run.sh: an unknown --device is exit 2 with one line; a --python that does not exist is the
  line `FAIL 0 setup: ...`, the summary and exit 1.

The whole check (pack.sh, then run.sh --device cpu against the unpacked tarball: about 5
minutes on 2 cores) is not run here; docs/gpu-check.md shows its output.

Usage: test_gpu_check.py SOURCE_ROOT KEEL_BINARY (any python3; the standard library only)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT, KEEL = sys.argv[1], sys.argv[2]
TOOLS = os.path.join(ROOT, "tools", "gpu_check")


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)


def readelf_view(path):
    """What pack.sh compares before and after a rewrite: the dynamic section less the path line,
    the dynamic symbols and the version tables."""
    d = run(["readelf", "-d", path]).stdout
    d = "\n".join(l for l in d.splitlines() if "(RPATH)" not in l and "(RUNPATH)" not in l)
    return d + run(["readelf", "--dyn-syms", "-W", path]).stdout + run(["readelf", "-V", "-W", path]).stdout


def search_path(path):
    for line in run(["readelf", "-d", path]).stdout.splitlines():
        if "(RPATH)" in line or "(RUNPATH)" in line:
            return line.split("[", 1)[1].rsplit("]", 1)[0]
    return None


class SetRunpath(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="keel-gpu-check-test.")
        os.makedirs(os.path.join(self.dir, "bin"))
        self.copy = os.path.join(self.dir, "bin", "keel")
        shutil.copy2(KEEL, self.copy)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def rewrite(self, path, new):
        return run([sys.executable, os.path.join(TOOLS, "set_runpath.py"), path, new])

    def test_rewrite_keeps_everything_else_and_runs(self):
        old = search_path(self.copy)
        self.assertIsNotNone(old, f"{KEEL} has no RPATH or RUNPATH")
        before = readelf_view(self.copy)
        r = self.rewrite(self.copy, "$ORIGIN/../lib")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(search_path(self.copy), "$ORIGIN/../lib")
        self.assertEqual(readelf_view(self.copy), before)
        self.assertEqual(os.path.getsize(self.copy), os.path.getsize(KEEL))
        # The libraries the old path found, by LD_LIBRARY_PATH instead (as run.sh does).
        dirs = [d for d in old.split(":") if "$" not in d and os.path.isdir(d)]
        env = dict(os.environ, LD_LIBRARY_PATH=":".join(dirs)) if dirs else dict(os.environ)
        r = run([self.copy, "--version"], env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith("keel "), r.stdout)

    def test_refusals_leave_the_file_unchanged(self):
        with open(self.copy, "rb") as f:
            original = f.read()
        text = os.path.join(self.dir, "not-elf")
        with open(text, "w") as f:
            f.write("#!/bin/sh\n")
        cases = [
            (self.copy, "/" + "x" * 4096, "is longer than"),
            (text, "$ORIGIN", "is not an ELF64 little-endian file"),
        ]
        # A file without RPATH or RUNPATH: the copy with its dynamic tag renamed would need
        # an ELF editor; Debian's libz has none and is always there.
        for lib in ("/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1"):
            if os.path.exists(lib) and search_path(lib) is None:
                plain = os.path.join(self.dir, "libz.so.1")
                shutil.copy(lib, plain)
                cases.append((plain, "$ORIGIN", "has no DT_RUNPATH or DT_RPATH entry"))
                break
        for path, new, message in cases:
            with self.subTest(path=os.path.basename(path), message=message):
                with open(path, "rb") as f:
                    before = f.read()
                r = self.rewrite(path, new)
                self.assertEqual(r.returncode, 1)
                self.assertIn(message, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                with open(path, "rb") as f:
                    self.assertEqual(f.read(), before)
        with open(self.copy, "rb") as f:
            self.assertEqual(f.read(), original)


def train(step, loss, **extra):
    return dict(split="train", step=step, loss=loss, step_time_ms=10.0, tokens_per_s=1000.0,
                samples_per_s=100.0, **extra)


FALLING = [train(s, 4.7 - 0.15 * s) for s in (2, 4, 6, 8, 10)]
GROUP = "[info] rank 0 of 1 (torchrun, local rank 0 of 1), nccl backend, device cuda:0\n"
PEAK = "[mfu] peak 31.2 TFLOP/s per device, measured now (float32 1024^3 matmuls)\n"
ROWS = ("[info] sparse_optimizer 'adagrad' updates 26 sparse tables: C1, C2, ..., C26 (rows as "
        "tensors on {})\n")


class Judge(unittest.TestCase):
    # (name, kind, records, run.log, directories to create, args after RUN_DIR, verdict, text)
    CASES = [
        ("lm passes", "lm", FALLING, "", [], ["10"], "PASS", "10 steps, loss 4.400 -> 3.200"),
        ("lm NaN", "lm", FALLING[:2] + [train(6, float("nan"))] + FALLING[3:], "", [], ["10"],
         "FAIL", "loss not finite at step(s) [6]"),
        ("lm not falling", "lm", [train(s, 4.0) for s in (5, 10)], "", [], ["10"], "FAIL",
         "the loss did not fall"),
        ("lm stopped early", "lm", FALLING[:4], "", [], ["10"], "FAIL", "ended at step 8, not 10"),
        ("lm no records", "lm", [dict(split="test", step=10, loss=3.0)], "", [], ["10"], "FAIL",
         "no training record"),
        ("lm fp16 numbers", "lm", [train(s, 4.7 - 0.15 * s, loss_scale=32768.0, skipped_steps=1)
                                   for s in (5, 10)], "", [], ["10"], "PASS",
         "loss scale 32768, 2 skipped steps"),
        ("group passes", "lm", FALLING, GROUP, [], ["10", "nccl"], "PASS",
         "nccl group of 1 rank(s) on cuda:0"),
        ("no group", "lm", FALLING, "[info] distributed.shard = \"parameters\" with one process\n",
         [], ["10", "nccl"], "FAIL", "keel formed no process group"),
        ("other backend", "lm", FALLING, GROUP.replace("nccl", "gloo"), [], ["10", "nccl"],
         "FAIL", "the process group's backend is gloo, not nccl"),
        ("mfu passes", "mfu", FALLING[:-1] + [train(10, 3.2, mfu=0.02, mfu_peak_tflops=31.2)],
         PEAK, [], ["5"], "PASS",
         "mfu 0.0200 at step 10 against a measured peak of 31.2 TFLOP/s (float32 matmul, measured now)"),
        ("mfu above 1", "mfu", [train(10, 3.2, mfu_peak_tflops=0.01)], "", [], ["5"], "FAIL",
         "the last record has no mfu"),
        ("peak on the CPU", "mfu", [train(10, 3.2, mfu=0.3, mfu_peak_tflops=0.03)], "", [], ["5"],
         "FAIL", "the peak is below 5 TFLOP/s"),
        ("no mfu table", "mfu", FALLING, "", [], ["5"], "FAIL", "no mfu_peak_tflops"),
        ("resume passes", "resume", FALLING + [train(12, 3.1), train(14, 3.0)], "",
         ["checkpoints/step-14"], ["10", "14"], "PASS",
         "saved at step 10 (loss 3.200), resumed to step 14 (loss 3.000)"),
        ("resume started over", "resume", FALLING + [train(12, 4.6), train(14, 4.5)], "",
         ["checkpoints/step-14"], ["10", "14"], "FAIL", "started over?"),
        ("resume short", "resume", FALLING + [train(12, 3.1)], "", ["checkpoints/step-14"],
         ["10", "14"], "FAIL", "ended at step 12, not 14"),
        ("resume no checkpoint", "resume", FALLING + [train(12, 3.1), train(14, 3.0)], "", [],
         ["10", "14"], "FAIL", "no checkpoints/step-14"),
        ("resume nothing after", "resume", FALLING, "", [], ["10", "14"], "FAIL",
         "5 training record(s) up to step 10 and 0 after it"),
        ("quickstart passes", "quickstart",
         FALLING + [dict(split="test", step=10, loss=0.3, accuracy=0.889)], "", [], ["0.85"],
         "PASS", "test accuracy 0.8890"),
        ("quickstart low", "quickstart",
         FALLING + [dict(split="test", step=10, loss=0.9, accuracy=0.61)], "", [], ["0.85"],
         "FAIL", "test accuracy 0.6100: below 0.85"),
        ("quickstart no test", "quickstart", FALLING, "", [], ["0.85"], "FAIL",
         "no test record with an accuracy"),
        ("ctr passes", "ctr", FALLING + [dict(split="test", step=10, loss=0.5, auc=0.79)],
         ROWS.format("cuda:0"), [], ["0.7", "cuda"], "PASS", "test auc 0.7900, rows on cuda:0"),
        ("ctr host rows", "ctr", FALLING + [dict(split="test", step=10, loss=0.5, auc=0.79)],
         ROWS.format("cpu").replace("rows as tensors on cpu", "rows in host memory"), [],
         ["0.7", "cuda"], "FAIL", "does not say the tables hand their rows as tensors"),
        ("ctr other device", "ctr", FALLING + [dict(split="test", step=10, loss=0.5, auc=0.79)],
         ROWS.format("cpu"), [], ["0.7", "cuda"], "FAIL", "the tables' rows are on cpu, not cuda"),
        ("ctr low auc", "ctr", FALLING + [dict(split="test", step=10, loss=0.7, auc=0.55)],
         ROWS.format("cuda:0"), [], ["0.7", "cuda"], "FAIL",
         "test auc 0.5500, rows on cuda:0: below 0.7"),
        ("ctr no test", "ctr", FALLING, ROWS.format("cuda:0"), [], ["0.7", "cuda"], "FAIL",
         "no test record with an auc"),
    ]

    def test_cases(self):
        for name, kind, recs, log, dirs, args, verdict, text in self.CASES:
            with self.subTest(name), tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "metrics.jsonl"), "w") as f:
                    for r in recs:
                        f.write(json.dumps(r) + "\n")
                with open(os.path.join(d, "run.log"), "w") as f:
                    f.write(log)
                for sub in dirs:
                    os.makedirs(os.path.join(d, sub))
                r = run([sys.executable, os.path.join(TOOLS, "judge.py"), kind, d] + args)
                self.assertEqual(r.returncode, 0, r.stderr)
                lines = r.stdout.splitlines()
                self.assertEqual(len(lines), 1, r.stdout)
                got_verdict, _, got_text = lines[0].partition("\t")
                self.assertEqual(got_verdict, verdict, lines[0])
                self.assertIn(text, got_text)

    def test_missing_run_directory(self):
        r = run([sys.executable, os.path.join(TOOLS, "judge.py"), "lm", "/nonexistent/run", "10"])
        self.assertEqual(r.stdout.strip(), "FAIL\tno /nonexistent/run/metrics.jsonl")


class RunScript(unittest.TestCase):
    def test_bad_device(self):
        r = run([os.path.join(TOOLS, "run.sh"), "--device", "gpu"])
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stdout, "")
        self.assertEqual(r.stderr, "run.sh: --device takes cuda or cpu; hint: run.sh --help\n")

    def test_no_python(self):
        r = run([os.path.join(TOOLS, "run.sh"), "--python", "/nonexistent/python"])
        self.assertEqual(r.returncode, 1)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "FAIL 0 setup: no Python that imports torch at "
                         "/nonexistent/python; hint: --python PATH/TO/venv/bin/python")
        self.assertTrue(lines[1].startswith("gpu-check: 0 passed, 1 failed, 0 skipped in "),
                        lines[1])
        self.assertEqual(len(lines), 2, r.stdout)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
