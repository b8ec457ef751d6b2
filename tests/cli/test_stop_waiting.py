"""A stop that reaches a dataset waiting for data (issue 43, finding 3; docs/loop.md, "Stopping";
ABI 1.10: keel_host.stop_requested and KEEL_BATCH_STOPPED).

A criteo stream with follow = true, poll_s = 0.05 and max_windows = 2 on a directory that holds
only window 0 (512 records, generated; batch_size 128: 4 steps a window) trains window 0 and
then waits in next() for window 1. One SIGTERM while it waits must:
- end the process within STOP_S seconds (before ABI 1.10 it waited for ever: the signal was
  only looked at after a step, and no step came) with 143, the exit status of a signalled stop;
- leave run.log's "run finished at step 4: stopped by SIGTERM" and a committed checkpoint
  step-4, the last finished step, which `--resume PATH` verifies before loading;
- resume exactly: with window 1 published (by rename, as a writer must), `keel train --resume
  CHECKPOINT` trains window 1 and ends when the stream does (max_windows), and its final
  checkpoint (dense parameters, adam's state, the tables' ids, rows and slots, the dataset's IO
  state) equals, array for array, that of a run that found both windows there from the start.
On two ranks (batch_size 64 each, started by hand with RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT as torchrun would), a SIGTERM to both while they wait: both exit 143 within STOP_S
and the checkpoint of step 4 holds both ranks' parts (the ranks agree on the stop with the
step's micro-batch count).

Five short keel processes (about 8 s); the fast tier.

Usage: test_stop_waiting.py KEEL_BINARY GENERATOR"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launching import free_port  # noqa: E402
from safetensors_np import read_arrays  # noqa: E402

KEEL, GENERATOR = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
STOP_S = 5.0  # seconds from SIGTERM to the process's exit that the test allows
WAIT_S = 60.0  # seconds to wait for window 0 to be trained

MANIFEST = """
[run]
name = "stop"
seed = 3
threads = 1
output_dir = "{out}"
mode = "train"
[train]
epochs = 1000000000
log_every = 1
[model]
type = "dlrm"
embedding_dim = 4
bottom_mlp = [8, 4]
top_mlp = [8]
[data.train]
type = "criteo"
path = "{data}"
batch_size = {batch}
follow = true
poll_s = 0.05
max_windows = 2
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


def read(path):
    with open(path) as f:
        return f.read()


def checkpoint(run, step):
    """Every object of a checkpoint: {object: {tensor: array}}."""
    d = os.path.join(run, "checkpoints", f"step-{step}")
    return {f[:-len(".safetensors")]: read_arrays(os.path.join(d, f))
            for f in sorted(os.listdir(d)) if f.endswith(".safetensors")}


class StopWhileWaiting(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="keel-stop-waiting-")
        cls.windows = os.path.join(cls.tmp.name, "windows")
        subprocess.run([GENERATOR, "--output", cls.windows, "--windows", "2", "--records", "512",
                        "--seed", "5"], check=True, capture_output=True)
        os.remove(os.path.join(cls.windows, "truth.json"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def manifest(self, name, data, batch=128):
        out = os.path.join(self.tmp.name, name)
        path = out + ".toml"
        with open(path, "w") as f:
            f.write(MANIFEST.format(out=out, data=data, batch=batch))
        return path, out

    def waiting_run(self, name, nproc=1):
        """A run (of nproc ranks) on a directory that holds window 0 only, once it waits for
        window 1: ([(process, its output file)] by rank, manifest, run directory, data
        directory)."""
        data = os.path.join(self.tmp.name, name + "-data")
        os.makedirs(data)
        shutil.copy(os.path.join(self.windows, "day_000.tsv"), data)
        path, out = self.manifest(name, data, batch=128 // nproc)
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
            log = open(os.path.join(self.tmp.name, f"{name}.{rank}.out"), "w+")
            proc = subprocess.Popen([KEEL, "train", path], stdout=log, stderr=subprocess.STDOUT,
                                    env=env)
            self.addCleanup(log.close)
            self.addCleanup(lambda p=proc: p.poll() is None and p.kill())
            procs.append((proc, log))
        deadline = time.monotonic() + WAIT_S
        run_log = os.path.join(out, "run.log")
        while "window 0 (" not in (read(run_log) if os.path.exists(run_log) else ""):
            for proc, _ in procs:
                self.assertIsNone(proc.poll(), "keel ended before window 0 was trained")
            self.assertLess(time.monotonic(), deadline, "window 0 was not trained in time")
            time.sleep(0.05)
        time.sleep(0.5)  # the epoch's end events, then next() waits for window 1
        for proc, _ in procs:
            self.assertIsNone(proc.poll(), "keel ended instead of waiting for window 1")
        return procs, path, out, data

    def stop(self, procs):
        """SIGTERM to every rank; [(exit status, output)] by rank, and the seconds until the
        last one exited."""
        sent = time.monotonic()
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
        results = []
        for proc, log in procs:
            try:
                code = proc.wait(timeout=max(0.1, sent + STOP_S - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.fail(f"keel did not exit within {STOP_S} s of a SIGTERM while its dataset "
                          "waited")
            log.seek(0)
            results.append((code, log.read()))
        return results, time.monotonic() - sent

    def test_sigterm_while_waiting_saves_and_resumes_exactly(self):
        procs, path, out, data = self.waiting_run("stopped")
        ((code, text),), took = self.stop(procs)
        self.assertEqual(code, 128 + signal.SIGTERM, text[-3000:])
        print(f"\nSIGTERM to exit: {took:.2f} s", file=sys.stderr)
        self.assertIn("run finished at step 4: stopped by SIGTERM", read(os.path.join(out, "run.log")))
        self.assertEqual(sorted(os.listdir(os.path.join(out, "checkpoints"))), ["step-4"])
        # Window 1 arrives; the run resumes from the checkpoint (verified first) and trains it.
        shutil.copy(os.path.join(self.windows, "day_001.tsv"), os.path.join(data, ".day_001.tmp"))
        os.rename(os.path.join(data, ".day_001.tmp"), os.path.join(data, "day_001.tsv"))
        r = subprocess.run([KEEL, "train", path, "--resume", os.path.join(out, "checkpoints",
                                                                         "step-4")],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertIn("run finished at step 8: the stream ended (epoch 2 had no batch)",
                      read(os.path.join(out, "run.log")))
        # The run that had both windows from the start.
        full_path, full = self.manifest("full", self.windows)
        r = subprocess.run([KEEL, "train", full_path], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        a, b = checkpoint(out, 8), checkpoint(full, 8)
        self.assertEqual(sorted(a), sorted(b))
        for obj in a:
            self.assertEqual(sorted(a[obj]), sorted(b[obj]), obj)
            for name in a[obj]:
                self.assertTrue(np.array_equal(a[obj][name], b[obj][name]), f"{obj}: {name}")

    def test_sigterm_to_two_waiting_ranks(self):
        procs, path, out, data = self.waiting_run("ranks", nproc=2)
        results, took = self.stop(procs)
        print(f"\ntwo ranks, SIGTERM to exit: {took:.2f} s", file=sys.stderr)
        for code, text in results:
            self.assertEqual(code, 128 + signal.SIGTERM, text[-3000:])
            self.assertIn("run finished at step 4: stopped by SIGTERM", text)
        saved = os.listdir(os.path.join(out, "checkpoints", "step-4"))
        self.assertIn("tables.safetensors", saved)
        self.assertIn("rank1.tables.safetensors", saved)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
