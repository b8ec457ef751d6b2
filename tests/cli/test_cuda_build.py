"""The CUDA-linked keel of a -Dtorch=wheel build (registered only when the build links CUDA and
NCCL: tests/cli/meson.build), on this machine, which may have no GPU:

1. keel links libtorch_cuda, libc10_cuda and the wheel's libnccl (readelf's NEEDED entries),
   and a plugin links none of them (plugins are CPU-linked: docs/torch.md);
2. `keel --version` names the CUDA and NCCL versions (the NCCL header keel was compiled with and
   the library it loaded, equal here) and as many GPUs as the Python torch of the same wheel
   counts;
3. the quickstart trains on the CPU with this binary (60 steps: a finite loss that went down);
4. without a GPU, `device = "cuda"` is one error line, exit status 1, and no run directory.

Usage: test_cuda_build.py KEEL_BINARY SOURCE_ROOT PLUGIN_SO (with the wheel's Python)."""
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import unittest

import torch

KEEL, ROOT, PLUGIN = sys.argv[1:4]


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                         check=True).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))


class CudaBuild(unittest.TestCase):
    def test_links(self):
        libs = needed(KEEL)
        # libc10_cuda too: linked with --no-as-needed, though keel names nothing of it
        self.assertTrue({"libtorch_cuda.so", "libc10_cuda.so", "libnccl.so.2"} <= libs, libs)
        plugin = needed(PLUGIN)
        self.assertIn("libtorch_cpu.so", plugin)
        self.assertFalse({"libtorch_cuda.so", "libnccl.so.2"} & plugin, plugin)

    def test_version(self):
        p = subprocess.run([KEEL, "--version"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        self.assertIn(f"LibTorch {torch.__version__.split('+')[0]}", p.stdout)
        m = re.search(r"^CUDA: CUDA (\d+)\.(\d+) and NCCL (\S+) \(library (\S+)\), (\d+) GPUs?$",
                      p.stdout, re.M)
        self.assertIsNotNone(m, p.stdout)
        self.assertEqual(f"{m[1]}.{m[2]}", torch.version.cuda)
        self.assertEqual(m[3], ".".join(map(str, torch.cuda.nccl.version())))
        self.assertEqual(m[3], m[4])
        self.assertEqual(int(m[5]), torch.cuda.device_count())

    def run_quickstart(self, out, *sets):
        args = [KEEL, "train", os.path.join(ROOT, "configs/quickstart.toml"),
                "--set", f'run.output_dir="{out}"']
        for s in sets:
            args += ["--set", s]
        return subprocess.run(args, capture_output=True, text=True, timeout=300)

    def test_cpu_run(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "run")
            p = self.run_quickstart(out, 'run.device="cpu"', "train.epochs=0",
                                    "train.max_steps=60", "train.log_every=10")
            self.assertEqual(p.returncode, 0, p.stderr)
            losses = []
            with open(os.path.join(out, "metrics.jsonl")) as f:
                for line in f:
                    r = json.loads(line)
                    if r.get("split") == "train" and "loss" in r:
                        losses.append(r["loss"])
            self.assertGreaterEqual(len(losses), 2, losses)
            self.assertTrue(all(math.isfinite(x) for x in losses), losses)
            self.assertLess(losses[-1], losses[0])

    @unittest.skipIf(torch.cuda.is_available(), "this machine has a GPU")
    def test_cuda_without_a_gpu(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "run")
            p = self.run_quickstart(out, 'run.device="cuda"')
            self.assertEqual(p.returncode, 1)
            self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
            self.assertEqual(p.stderr, 'keel: error: --set run.device="cuda": run.device = '
                             '"cuda": CUDA is not available to this process; hint: use device = '
                             '"cpu" or "auto"\n')
            self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
