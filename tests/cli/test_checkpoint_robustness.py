"""Checkpoints survive keel being broken on purpose (issue 8).

1. SIGKILL at random moments while keel saves a checkpoint after every step, synchronously and
   with [checkpoint] async = true: every step-* directory left behind is complete, the next
   `--resume` starts from the newest one without skipping any, what killed saves left behind is
   removed by the next run, and the final parameters and optimizer state equal, bit for bit,
   those of an uninterrupted run.
2. Two runs started together into one output directory with keep_last = 2 keep exactly their
   own two newest checkpoints (the second to commit a step number takes step-<N>-<run_id>); a
   SIGKILL at random moments while keep_last = 1 prunes after every step never leaves a step-*
   directory that is not a complete checkpoint, nor deletes the newest one.
3. A file size limit (ulimit -f) that the first checkpoint fits and the second does not: one
   clear error, exit status 1, nothing partial left, the previous checkpoint still resumes.
4. A flipped byte in a tensor file of the newest checkpoint: `--resume` names the file and
   resumes from the previous checkpoint; `--resume PATH` of the damaged one fails naming it.
5. SIGTERM (143) and SIGINT (130) stop after a step with a checkpoint of that step, from which
   `--resume` reaches the same final parameters as an uninterrupted run.
6. `--resume` with a changed manifest: a model option is an error naming the key (and, with
   --resume-changed, a shape mismatch naming the tensor and both shapes), a key safe to change is a
   warning; `--resume` without any checkpoint starts fresh and says so.

7. A handed checkpoint (issue 43): a commit record whose chunk names an object outside the
   checkpoint ("../outside/evil"), a listed file that is a symbolic link out of it, a flipped
   byte in commit.json, and a torch-backend checkpoint whose 2.5 KB rng.pt holds a stride-0
   tensor that its record claims at [2^28, 2] F32 (2 GiB): `--resume`, init_from and
   `keel export` each refuse with one error line, nothing is loaded from outside, and the
   stride-0 case stays far below the claimed memory (peak RSS from wait4).

What is checked in Python: commit.json parses and lists every file of its directory with the
size the file has (keel's `--resume` verifies the checksums, and a failed verification shows
up as a "skipping" warning, which is asserted absent). Tensor files are read with json, struct
and numpy only. The handed-checkpoint cases rewrite records as someone handing one over would,
checksums included (handed.py: XXH3-64 from the system's libxxhash, which keel links).

Random choices (kill delays) come from seeded random.Random instances, so a run of this file
makes the same choices each time; where the kills land still depends on the machine's speed.

Usage: test_checkpoint_robustness.py KEEL_BINARY SOURCE_ROOT [TEST_NAME...]"""
import io
import json
import os
import random
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile

from handed import recommit
from safetensors_np import read_raw

KEEL, ROOT = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
DATA_DIR = "/usr/share/datasets/fashion-mnist"
ENV = {k: v for k, v in os.environ.items() if k != "KEEL_LOG_LEVEL"}
ENV.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")

KILL_STEPS = 40     # steps of the SIGKILL runs (one checkpoint per step)
SIGNAL_STEPS = 200  # steps of the SIGTERM / SIGINT runs (only the stop and at_end checkpoints)


def write_manifest(tmp, name, *, steps, every_steps=1, keep_last=0, seed=7, initial=False,
                   log_every=5, backend="safetensors"):
    """<tmp>/<name>.toml training an mlp [32] on 256 shuffled Fashion-MNIST samples in batches
    of 16 (16 steps an epoch) with AdamW at a constant learning rate for `steps` steps, output in
    <tmp>/<name>. Returns (manifest path, output directory)."""
    run_dir = os.path.join(tmp, name)
    text = f"""
[run]
output_dir = "{run_dir}"
seed = {seed}
threads = 1

[train]
epochs = 0
max_steps = {steps}
log_every = {log_every}

[model]
type = "mlp"
hidden = [32]

[data.train]
type = "fashion_mnist"
path = "{DATA_DIR}"
split = "train"
limit = 256
batch_size = 16

[optimizer]
type = "adamw"
lr = 1e-3

[lr_scheduler]
type = "constant"

[loss]
type = "cross_entropy"

[checkpoint]
type = "{backend}"
every_steps = {every_steps}
keep_last = {keep_last}
initial = {"true" if initial else "false"}
"""
    path = os.path.join(tmp, name + ".toml")
    with open(path, "w") as f:
        f.write(text)
    return path, run_dir


def keel(*args, timeout=120):
    """(exit status, stdout, stderr) of `keel ARGS`; keel logs on stdout, errors on stderr."""
    p = subprocess.run([KEEL, *args], capture_output=True, text=True, timeout=timeout, env=ENV)
    return p.returncode, p.stdout, p.stderr


def ckpt_root(run_dir):
    return os.path.join(run_dir, "checkpoints")


def data_offset(path):
    """Where the tensor data of a safetensors file begins."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    return 8 + n


# ---- checkpoint directories ----

STEP_DIR = re.compile(r"step-(\d+)(-[0-9a-f]{16})?")
LEFTOVER = re.compile(r"\.step-\d+-[0-9a-f]{16}\.(tmp|lock)|\.trash-[0-9a-f]{16}")


def complete_checkpoint(path):
    """The commit record of `path` when it is a complete checkpoint: commit.json parses, names
    format keel-checkpoint, and lists every other file of the directory with the size it has.
    Otherwise None."""
    try:
        with open(os.path.join(path, "commit.json")) as f:
            record = json.load(f)
        if record["format"] != "keel-checkpoint" or not isinstance(record["step"], int):
            return None
        listed = {e["name"]: e["size"] for e in record["files"]}
        present = set(os.listdir(path)) - {"commit.json", "commit.json.xxh3"}
        if present != set(listed):
            return None
        for name, size in listed.items():
            if os.path.getsize(os.path.join(path, name)) != size:
                return None
        return record
    except (OSError, ValueError, KeyError, TypeError):
        return None


def kill_after(p, rng):
    """SIGKILL for keel process `p` (stdout piped, text) at a random moment: after it has logged
    a random 1 to 6 checkpoint commits, plus a random 0 to 5 ms (a step with its save takes a
    few ms here). Counting commits rather than time keeps the number of attempts, and so the
    test's duration, independent of the machine's load. Returns everything `p` printed."""
    commits, lines = rng.randint(1, 6), []
    delay = rng.uniform(0.0, 0.005)
    for line in p.stdout:
        lines.append(line)
        if "checkpoint committed:" in line:
            commits -= 1
            if commits == 0:
                time.sleep(delay)
                p.kill()  # SIGKILL; nothing when keel has already exited
                break
    return "".join(lines) + p.communicate(timeout=120)[0]


def newest(complete):
    """The step of the newest complete checkpoint in {name: record} (None: there is none)."""
    return max((r["step"] for r in complete.values()), default=None)


class CheckpointTest(unittest.TestCase):
    def audit(self, run_dir, leftovers_allowed=True):
        """Every entry of <run_dir>/checkpoints: a step-* directory must be a complete
        checkpoint; staging directories, lock files and trash are allowed (when
        `leftovers_allowed`); nothing else may be there. Returns ({name: record}, {leftover})."""
        root = ckpt_root(run_dir)
        complete, leftovers = {}, set()
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            if STEP_DIR.fullmatch(name):
                record = complete_checkpoint(path)
                self.assertIsNotNone(record, f"{path} is not a complete checkpoint: "
                                     f"{sorted(os.listdir(path)) if os.path.isdir(path) else 'a file'}")
                complete[name] = record
            elif LEFTOVER.fullmatch(name):
                self.assertTrue(leftovers_allowed, f"{path} is left behind")
                leftovers.add(name)
            else:
                self.fail(f"unexpected entry {path}")
        return complete, leftovers

    def assert_same_tensors(self, a, b, what):
        """Two safetensors files hold the same tensor names, dtypes, shapes and bytes."""
        ta, tb = read_raw(a), read_raw(b)
        self.assertEqual(sorted(ta), sorted(tb), what)
        for name in ta:
            (da, sa, xa), (db, sb, xb) = ta[name], tb[name]
            self.assertEqual((da, sa), (db, sb), f"{what}: {name}")
            self.assertEqual(xa.tobytes(), xb.tobytes(), f"{what}: {name} differs")

    def assert_same_final(self, run_dir, reference_dir, steps, what):
        for stem in ("model", "optimizer"):
            self.assert_same_tensors(
                os.path.join(ckpt_root(run_dir), f"step-{steps}", f"{stem}.safetensors"),
                os.path.join(ckpt_root(reference_dir), f"step-{steps}", f"{stem}.safetensors"),
                f"{what}: {stem} after {steps} steps against an uninterrupted run")

    def assert_one_error_line(self, rc, err, *parts):
        self.assertEqual(rc, 1, err)
        lines = err.strip().splitlines()
        self.assertEqual(len(lines), 1, err)
        self.assertTrue(lines[0].startswith("keel: error: "), err)
        for part in parts:
            self.assertIn(part, lines[0])
        self.assertNotIn("terminate called", err)
        self.assertNotIn("Exception raised from", err)

    def reference(self, tmp, steps):
        """An uninterrupted run of the same training (a checkpoint only at the end)."""
        path, run_dir = write_manifest(tmp, "reference", steps=steps, every_steps=0)
        rc, out, err = keel("train", path)
        self.assertEqual(rc, 0, err + out)
        return run_dir


class KillDuringSaves(CheckpointTest):
    def kill_loop(self, extra, seed):
        """`keel train M --resume` again and again, each killed (see kill_after) until one
        exits 0."""
        rng = random.Random(seed)
        with tempfile.TemporaryDirectory() as tmp:
            reference = self.reference(tmp, KILL_STEPS)
            path, run_dir = write_manifest(tmp, "run", steps=KILL_STEPS, every_steps=1)
            root = ckpt_root(run_dir)
            committed = kills = mid_save = 0
            complete, leftovers = {}, set()
            for attempt in range(200):
                p = subprocess.Popen([KEEL, "train", path, "--resume", *extra], env=ENV,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                out = kill_after(p, rng)
                self.assertIn(p.returncode, (0, -signal.SIGKILL), out)
                self.assertNotIn("keel: error", out)
                # keel verified every checkpoint it looked at (XXH3): none failed.
                self.assertNotIn("skipping", out)
                start = newest(complete)
                if start is None:
                    self.assertIn("starting a fresh run", out)
                else:
                    self.assertIn(f"resuming from {root}/step-{start} (step {start},", out)
                # What the previous kill left behind was removed when this run started.
                self.assertFalse(leftovers & set(os.listdir(root)),
                                 f"not removed by the next run: {leftovers & set(os.listdir(root))}")
                before = set(complete)
                complete, leftovers = self.audit(run_dir)
                committed += len(set(complete) - before)
                if p.returncode == 0:
                    break
                kills += 1
                mid_save += any(n.endswith(".tmp") for n in leftovers)
            else:
                self.fail("200 attempts and no run reached its end")
            self.assertGreaterEqual(kills, 5)
            self.assertGreaterEqual(committed, 30)
            self.audit(run_dir, leftovers_allowed=False)
            self.assertIn(f"step-{KILL_STEPS}", complete)
            self.assert_same_final(run_dir, reference, KILL_STEPS, f"killed {kills} times")
            return mid_save

    def test_sigkill_sync_and_async(self):
        # At least one kill must have landed inside a save, leaving its staging directory:
        # otherwise the loops did not test what they claim to. (Here most do: with a save after
        # every step of a model this small, the save takes most of a step's time.)
        mid_save = self.kill_loop([], seed=1)
        mid_save += self.kill_loop(["--set", "checkpoint.async=true"], seed=2)
        self.assertGreaterEqual(mid_save, 1, "no kill landed inside a save")


class SharedDirectoryAndPruning(CheckpointTest):
    def test_two_runs_keep_their_own(self):
        # Started together, the two runs commit the same step numbers at nearly the same time.
        with tempfile.TemporaryDirectory() as tmp:
            steps = 100
            a, run_dir = write_manifest(tmp, "run", steps=steps, keep_last=2, seed=1)
            b = os.path.join(tmp, "b.toml")
            with open(a) as f:
                text = f.read()
            with open(b, "w") as f:
                f.write(text.replace("seed = 1\n", "seed = 2\n"))
            # Sharing a run directory is explicit (--overwrite): without it, the second run to
            # start would be refused, as the directory then holds the first one's records.
            procs = [subprocess.Popen([KEEL, "train", m, "--overwrite"], env=ENV,
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True) for m in (a, b)]
            for p in procs:
                out = p.communicate(timeout=120)[0]
                self.assertEqual(p.returncode, 0, out)
            complete, _ = self.audit(run_dir, leftovers_allowed=False)
            runs = {}
            for name, record in complete.items():
                with open(os.path.join(ckpt_root(run_dir), name, "manifest.resolved.toml")) as f:
                    seed = re.search(r"^seed = (\d+)$", f.read(), re.M).group(1)
                runs.setdefault(record["run_id"], []).append((record["step"], seed))
            self.assertEqual(len(runs), 2, complete.keys())
            seeds = set()
            for run_id, kept in runs.items():
                self.assertEqual(sorted(s for s, _ in kept), [steps - 1, steps],
                                 f"run {run_id} kept {sorted(kept)}")
                self.assertEqual(len({seed for _, seed in kept}), 1, kept)  # one run's content
                seeds.add(kept[0][1])
            self.assertEqual(seeds, {"1", "2"})
            # Both committed a step-<steps>: the second one to commit it named its own
            # step-<steps>-<run_id>, leaving the other's alone.
            last = sorted(n for n, r in complete.items() if r["step"] == steps)
            self.assertEqual(len(last), 2, last)
            self.assertEqual(last[0], f"step-{steps}")
            self.assertEqual(last[1], f"step-{steps}-{complete[last[1]]['run_id']}")

    def test_kill_during_pruning(self):
        rng = random.Random(3)
        with tempfile.TemporaryDirectory() as tmp:
            path, run_dir = write_manifest(tmp, "run", steps=KILL_STEPS, keep_last=1)
            kills = 0
            for attempt in range(8):
                p = subprocess.Popen([KEEL, "train", path, "--resume"], env=ENV,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                out = kill_after(p, rng)
                self.assertIn(p.returncode, (0, -signal.SIGKILL), out)
                # Only complete step-* directories (audit); at least one, the newest, and at
                # most the one before it too (a new checkpoint is committed before the old one
                # is pruned, and the kill may fall in between).
                complete, _ = self.audit(run_dir)
                kept = sorted(r["step"] for r in complete.values())
                self.assertTrue(kept and kept in ([kept[-1]], [kept[-1] - 1, kept[-1]]), kept)
                if p.returncode == 0:
                    break
                kills += 1
            self.assertGreaterEqual(kills, 4)


class DiskFull(CheckpointTest):
    def test_file_size_limit(self):
        with tempfile.TemporaryDirectory() as tmp:
            # step-0 (initial = true) is saved before AdamW has moments: its largest file is
            # model.safetensors (~100 kB). From step 1 on optimizer.safetensors (~200 kB) holds
            # exp_avg and exp_avg_sq. A 150 KiB limit lets step-0 through and fails step-1.
            path, run_dir = write_manifest(tmp, "run", steps=5, initial=True)
            limit_kib = 150
            p = subprocess.run(["bash", "-c", f'ulimit -f {limit_kib}; exec "$0" "$@"', KEEL,
                                "train", path], capture_output=True, text=True, timeout=120,
                               env=ENV)
            step0 = os.path.join(ckpt_root(run_dir), "step-0")
            self.assertLess(os.path.getsize(os.path.join(step0, "model.safetensors")),
                            limit_kib * 1024)
            self.assert_one_error_line(p.returncode, p.stderr, "optimizer.safetensors",
                                       ".step-1-")
            complete, _ = self.audit(run_dir, leftovers_allowed=False)
            self.assertEqual(sorted(complete), ["step-0"])
            rc, out, err = keel("train", path, "--resume")
            self.assertEqual(rc, 0, err + out)
            self.assertIn(f"resuming from {step0} (step 0,", out)
            self.assertNotIn("skipping", out)
            self.audit(run_dir, leftovers_allowed=False)
            self.assertIsNotNone(complete_checkpoint(os.path.join(ckpt_root(run_dir), "step-5")))


class FlippedByte(CheckpointTest):
    def test_flipped_byte_in_each_tensor_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            steps = 6
            path, run_dir = write_manifest(tmp, "run", steps=steps)
            rc, out, err = keel("train", path)
            self.assertEqual(rc, 0, err + out)
            root = ckpt_root(run_dir)
            last = os.path.join(root, f"step-{steps}")
            for stem in ("model", "optimizer"):
                damaged = os.path.join(last, f"{stem}.safetensors")
                with open(damaged, "rb") as f:
                    original = f.read()
                # One byte in the middle of the tensor data: the header still parses, the size
                # is unchanged, only the checksum can tell.
                at = (data_offset(damaged) + len(original)) // 2
                with open(damaged, "r+b") as f:
                    f.seek(at)
                    f.write(bytes([original[at] ^ 0xFF]))

                rc, out, err = keel("train", path, "--resume", last)
                self.assert_one_error_line(rc, err, f"--resume {last}: cannot resume from it",
                                           f"{damaged}: checksum mismatch")

                rc, out, err = keel("train", path, "--resume")
                self.assertEqual(rc, 0, err + out)
                self.assertIn(f"--resume: skipping {last}: {damaged}: checksum mismatch", out)
                self.assertIn(f"resuming from {root}/step-{steps - 1} (step {steps - 1},", out)
                # The resumed run saved step-6 again: the same bytes as before the damage.
                self.assertIsNotNone(complete_checkpoint(last))
                with open(damaged, "rb") as f:
                    self.assertEqual(f.read(), original, f"{damaged} saved again differs")


class StopSignals(CheckpointTest):
    def stop(self, tmp, sig, output_dir=None):
        """A run sent `sig` after its first step's log line, checked to have committed exactly
        one checkpoint, of the step it stopped after: (exit status, output, that step, manifest
        path, output directory). `output_dir`: given with --set run.output_dir=..."""
        path, run_dir = write_manifest(tmp, "run", steps=SIGNAL_STEPS, every_steps=0,
                                       log_every=1)
        sets = []
        if output_dir is not None:
            sets, run_dir = ["--set", f"run.output_dir={output_dir}"], output_dir
        p = subprocess.Popen([KEEL, "train", path, *sets], env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in p.stdout:
            lines.append(line)
            if f"step 1/{SIGNAL_STEPS}" in line:
                p.send_signal(sig)
                break
        out = "".join(lines) + p.communicate(timeout=120)[0]
        name = "SIGTERM" if sig == signal.SIGTERM else "SIGINT"
        m = re.search(rf"{name} received: stopping after step (\d+) and saving a checkpoint", out)
        self.assertIsNotNone(m, out)
        stopped = int(m.group(1))
        self.assertLess(stopped, SIGNAL_STEPS, "the signal came too late to test anything")
        complete, _ = self.audit(run_dir, leftovers_allowed=False)
        self.assertEqual(sorted(complete), [f"step-{stopped}"])
        self.assertEqual(complete[f"step-{stopped}"]["step"], stopped)
        return p.returncode, out, stopped, path, run_dir

    def test_sigterm_then_resume(self):
        with tempfile.TemporaryDirectory() as tmp:
            reference = self.reference(tmp, SIGNAL_STEPS)
            rc, out, stopped, path, run_dir = self.stop(tmp, signal.SIGTERM)
            self.assertEqual(rc, 143, out)
            rc, out, err = keel("train", path, "--resume")
            self.assertEqual(rc, 0, err + out)
            self.assertIn(f"resuming from {ckpt_root(run_dir)}/step-{stopped} (step {stopped},",
                          out)
            self.assert_same_final(run_dir, reference, SIGNAL_STEPS, f"SIGTERM at {stopped}")

    def test_sigint(self):
        with tempfile.TemporaryDirectory() as tmp:
            # --set run.output_dir (with a space and a quote to quote): the command the run
            # prints continues this run, in that directory, not the manifest's, with keel as it
            # was run (argv[0], here the absolute path KEEL), not a `keel` that may not be on
            # PATH.
            other = os.path.join(tmp, "the other's dir")
            rc, out, _, path, _ = self.stop(tmp, signal.SIGINT, output_dir=other)
            self.assertEqual(rc, 130, out)
            m = re.search(r"stopped by SIGINT; continue with: (.*)", out)
            self.assertIsNotNone(m, out)
            self.assertEqual(shlex.split(m.group(1)),
                             [KEEL, "train", path, "--set", f"run.output_dir={other}",
                              "--resume"])


def stride0_pt(name, sizes):
    """A .pt (the archive torch.save writes, records stored) holding {name: a Float tensor of
    `sizes` at stride 0 over a storage of one element}: a few hundred bytes."""
    def s(v):
        return b"X" + struct.pack("<I", len(v)) + v.encode()

    def i64(v):
        return b"\x8a\x08" + struct.pack("<q", v)

    def tup(vs):
        return b"(" + b"".join(i64(v) for v in vs) + b"t"

    pkl = (b"\x80\x02}(" + s(name) + b"ctorch._utils\n_rebuild_tensor_v2\n((" + s("storage") +
           b"ctorch\nFloatStorage\n" + s("0") + s("cpu") + i64(1) + b"tQ" + i64(0) +
           tup(sizes) + tup([0] * len(sizes)) + b"\x89ccollections\nOrderedDict\n)RtRu.")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/version", "3\n")
        z.writestr("archive/data/0", struct.pack("<f", 1.0))
    return buf.getvalue()


def keel_peak(*args, timeout=120):
    """(exit status, stdout, stderr, peak RSS in MiB) of `keel ARGS` (wait4's ru_maxrss)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen([KEEL, *args], stdout=out, stderr=err, env=ENV)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (p.returncode, out.read().decode(errors="replace"),
                err.read().decode(errors="replace"), usage.ru_maxrss / 1024)


class HandedCheckpoint(CheckpointTest):
    """issue 43, findings 2, 8 and 9: what a handed checkpoint's record names and claims."""

    def trained(self, tmp, backend):
        path, run_dir = write_manifest(tmp, "handed-" + backend, steps=4, every_steps=0,
                                       backend=backend)
        rc, out, err = keel("train", path)
        self.assertEqual(rc, 0, err + out)
        return path, os.path.join(ckpt_root(run_dir), "step-4")

    def refused_everywhere(self, tmp, manifest, ckpt, *parts):
        """--resume PATH, init_from and export of `ckpt` each end in one error line with
        `parts`."""
        self.assert_one_error_line(*keel("train", manifest, "--resume", ckpt)[::2], *parts)
        self.assert_one_error_line(*keel("train", manifest, "--set",
                                         f"run.output_dir={tmp}/fresh", "--set",
                                         f"checkpoint.init_from={ckpt}")[::2], *parts)
        self.assertFalse(os.path.exists(f"{tmp}/fresh"))
        out = os.path.join(tmp, "exported")
        self.assert_one_error_line(*keel("export", ckpt, "--format", "safetensors", "--output",
                                         out)[::2], *parts)
        self.assertFalse(os.path.exists(out))

    def test_object_outside_symlink_and_flipped_record(self):
        with tempfile.TemporaryDirectory() as tmp:
            manifest, saved = self.trained(tmp, "safetensors")
            # A chunk naming "../outside/evil", whose file is there (a copy of the model).
            handed = os.path.join(tmp, "handed", "step-4")
            shutil.copytree(saved, handed)
            os.makedirs(os.path.join(tmp, "handed", "outside"))
            shutil.copy(os.path.join(saved, "model.safetensors"),
                        os.path.join(tmp, "handed", "outside", "evil.safetensors"))

            def outside(record):
                for g in record["chunks"]["model"].values():
                    for c in g["chunks"]:
                        c["object"] = "../outside/evil"
                        c.pop("file", None)
            recommit(handed, outside)
            self.refused_everywhere(tmp, manifest, handed, f"{handed}/commit.json",
                                    "names object '../outside/evil' is not a plain name")
            # A listed file that is a symbolic link to a file of the same bytes outside.
            linked = os.path.join(tmp, "linked", "step-4")
            shutil.copytree(saved, linked)
            copy = os.path.join(tmp, "linked", "model.safetensors")
            shutil.move(os.path.join(linked, "model.safetensors"), copy)
            os.symlink(copy, os.path.join(linked, "model.safetensors"))
            self.refused_everywhere(tmp, manifest, linked, f"{linked}/model.safetensors: a "
                                    "symbolic link, not a file of the checkpoint")
            # A flipped byte in commit.json (its checksum file kept).
            flipped = os.path.join(tmp, "flipped", "step-4")
            shutil.copytree(saved, flipped)
            with open(os.path.join(flipped, "commit.json"), "r+b") as f:
                text = f.read()
                f.seek(0)
                f.write(text.replace(b'"step": 4', b'"step": 6', 1))
            self.refused_everywhere(tmp, manifest, flipped,
                                    f"{flipped}/commit.json: checksum mismatch")

    def test_stride0_pt_claiming_2_gib(self):
        with tempfile.TemporaryDirectory() as tmp:
            manifest, trained = self.trained(tmp, "torch")
            saved = os.path.join(tmp, "stride0", "step-4")
            shutil.copytree(trained, saved)
            sizes = [1 << 28, 2]  # 2 GiB of F32
            with open(os.path.join(saved, "rng.pt"), "wb") as f:
                f.write(stride0_pt("torch.cpu", sizes))
            self.assertLess(os.path.getsize(os.path.join(saved, "rng.pt")), 2560)

            def claim(record):
                record["tensors"]["rng"] = [{"name": "torch.cpu", "dtype": "F32",
                                             "shape": sizes}]
            recommit(saved, claim)
            rc, out, err, peak = keel_peak("train", manifest, "--resume", saved)
            self.assert_one_error_line(rc, err, f"{saved}/commit.json: tensor 'torch.cpu' of "
                                       "object 'rng' claims 2147483648 bytes ([268435456, 2] "
                                       "F32), more than its files hold (rng.pt: ")
            self.assertLess(peak, 1024, f"peak RSS {peak:.0f} MiB")
            # The claims that overflow 64 bits (an optimizer entry of [2^62, 4]): one line
            # naming the tensor and the record, not an internal error (exit 70).
            saved = os.path.join(tmp, "overflow", "step-4")
            shutil.copytree(trained, saved)

            def overflow(record):
                entry = next(iter(record["chunks"]["optimizer"].values()))
                entry["shape"] = [1 << 62, 4]
                entry.pop("like", None)
                entry["chunks"] = [{"offset": [0, 0], "size": [1 << 62, 4],
                                    "object": entry["chunks"][0]["object"]}]
            recommit(saved, overflow)
            self.assert_one_error_line(*keel("train", manifest, "--resume", saved)[::2],
                                       f"{saved}/commit.json: optimizer tensor",
                                       "claims shape [4611686018427387904, 4] of F32, more "
                                       "bytes than 64 bits count")


class ChangedManifest(CheckpointTest):
    def test_changes(self):
        with tempfile.TemporaryDirectory() as tmp:
            path, run_dir = write_manifest(tmp, "run", steps=4)
            rc, out, err = keel("train", path)
            self.assertEqual(rc, 0, err + out)
            last = os.path.join(ckpt_root(run_dir), "step-4")

            rc, out, err = keel("train", path, "--resume", "--set", "model.hidden=[16]")
            self.assert_one_error_line(rc, err, "--resume: model.hidden changed",
                                       "--resume-changed")
            # Both values, as TOML arrays (keel writes them "[ 32 ]").
            self.assertRegex(err, r"\(\[ ?32 ?\] -> \[ ?16 ?\]\)")

            rc, out, err = keel("train", path, "--resume", "--resume-changed",
                                "--set", "model.hidden=[16]")
            self.assertIn("--resume: model.hidden changed since the checkpoint", out)
            self.assert_one_error_line(rc, err, f"{last}: tensor 'fc1.weight' has shape "
                                       "[32, 784] in the checkpoint and [16, 784] in")

            rc, out, err = keel("train", path, "--resume", "--set", "train.log_every=3")
            self.assertEqual(rc, 0, err + out)
            self.assertIn("--resume: train.log_every changed since the checkpoint (5 -> 3)", out)
            self.assertIn(f"resuming from {last} (step 4,", out)

            path, run_dir = write_manifest(tmp, "empty", steps=4)
            rc, out, err = keel("train", path, "--resume")
            self.assertEqual(rc, 0, err + out)
            self.assertIn(f"--resume: no complete checkpoint in {ckpt_root(run_dir)}: starting "
                          "a fresh run", out)
            self.assertNotIn("resuming from", out)
            complete, _ = self.audit(run_dir, leftovers_allowed=False)
            self.assertEqual(newest(complete), 4)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[3:], verbosity=2)
