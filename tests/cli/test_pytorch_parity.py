"""Parity with PyTorch: keel's training loop against a reference loop written with torch.optim,
torch.optim.lr_scheduler.LambdaLR, torch.nn.functional.cross_entropy and
torch.nn.utils.clip_grad_norm_. Both start from the same weights (keel's step-0 checkpoint) and
see the same Fashion-MNIST batches in the same order (shuffle = false); after N optimizer steps
every parameter of keel's step-N checkpoint must equal the Python model's bit for bit
(torch.equal, max abs difference 0.0), in every scenario below, but for one: with a PyTorch whose
torch.optim.Adam updates its first moment with lerp_ (2.x: ADAM_LERP below), the Adam and AdamW
scenarios allow a max abs difference of 1e-7, because keel's adam and adamw are the C++
frontend's torch::optim::Adam and AdamW, which update it with mul_ and add_ (rounded differently
in the last bit).

Exact equality is achievable because both sides run the same floating-point operations in the
same order on the same libraries: the Python process loads the libtorch_cpu and the OpenBLAS
that keel links (test_same_libraries checks this), both run one LibTorch thread and a
single-threaded OpenBLAS, and keel's plugins run the tensor operations the Python code below runs,
in the same order (the scenarios' comments say where the two are written differently and why
the results are still the same floats).

Usage: test_pytorch_parity.py KEEL_BINARY SOURCE_ROOT

Runs with the Python of the LibTorch keel links (Debian's /usr/bin/python3 with python3-torch
1.13, or the wheel's virtual environment with PyTorch 2.11: docs/torch.md). The
`safetensors` package is not needed: checkpoints are parsed by hand (tests/cli/safetensors_np.py)."""
import os

# One thread everywhere, as keel runs here: [run] threads = 1 below gives keel one LibTorch
# thread, and OpenBLAS as many (kernel/blas.hpp). OpenBLAS and OpenMP read these variables
# when torch loads them, so they must be set before `import torch`; torch.set_num_threads(1)
# below sets LibTorch's intra-op pool too.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import collections
import glob
import json
import math
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

# keel loads its BLAS by path (a DT_RPATH to OpenBLAS's OpenMP build: meson.build), Python the
# libblas.so.3 the machine's BLAS alternatives select. So that both run the same BLAS whatever
# those select, this script runs again with the directory of keel's libblas.so.3 first on
# LD_LIBRARY_PATH before torch loads it (test_same_libraries checks the outcome).
_keel_libs = subprocess.run(["ldd", os.path.abspath(sys.argv[1])], capture_output=True,
                            text=True, check=True).stdout
_keel_blas = [w for w in _keel_libs.split() if w.startswith("/") and "/libblas.so" in w]
if _keel_blas and os.environ.get("KEEL_PARITY_BLAS_DIR") is None:
    _dir = os.path.dirname(_keel_blas[0])
    os.environ["KEEL_PARITY_BLAS_DIR"] = _dir
    os.environ["LD_LIBRARY_PATH"] = ":".join(
        p for p in (_dir, os.environ.get("LD_LIBRARY_PATH", "")) if p)
    os.execv(sys.executable, [sys.executable, *sys.argv])

import torch
import torch.nn.functional as F

from fashion_mnist_torch import DATA_DIR, fashion_mnist
from safetensors_np import read_arrays

torch.set_num_threads(1)

KEEL, ROOT = sys.argv[1], sys.argv[2]
# torch.optim.Adam(W)'s single-tensor step updates exp_avg with lerp_ (PyTorch 2.x) rather than
# with mul_ and add_ as the C++ frontend does (and 1.13's Python did).
import importlib  # noqa: E402
import inspect  # noqa: E402
ADAM_LERP = "exp_avg.lerp_(" in inspect.getsource(importlib.import_module("torch.optim.adam"))
ADAM_ATOL = 1e-7 if ADAM_LERP else 0.0
HIDDEN = [64, 32]


# ---- safetensors, by hand (tests/cli/safetensors_np.py), as torch tensors ----

def read_safetensors(path):
    return collections.OrderedDict((name, torch.from_numpy(a.copy()))
                                   for name, a in read_arrays(path).items())


# ---- Fashion-MNIST batches (tests/cli/fashion_mnist_torch.py reads and scales the data as the
# fashion_mnist plugin does) ----

def batches(x, y, batch_size):
    """Batches in file order (shuffle = false), over and over: epoch after epoch."""
    while True:
        for i in range(0, x.shape[0], batch_size):
            yield x[i:i + batch_size], y[i:i + batch_size]


# ---- the model: keel's mlp (fc1, act1, fc2, act2, ..., fcL) as a plain nn.Module ----

def mlp(hidden, in_features=784, classes=10):
    widths = [in_features, *hidden, classes]
    layers = collections.OrderedDict()
    for i in range(len(widths) - 1):
        layers[f"fc{i + 1}"] = torch.nn.Linear(widths[i], widths[i + 1])
        if i + 2 < len(widths):
            layers[f"act{i + 1}"] = torch.nn.ReLU()
    return torch.nn.Sequential(layers)


# ---- the schedule, written independently from keel's description ----

def warmup_cosine(warmup, total, min_factor=0.0):
    """Factor for 0-based optimizer step s: linear warmup (s + 1) / warmup over the first
    `warmup` steps, then half a cosine from 1 down to min_factor at step `total`."""
    def factor(s):
        if s < warmup:
            return (s + 1) / warmup
        progress = min(1.0, (s - warmup) / max(1, total - warmup))
        return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


# ---- running keel ----

def run_keel(tmp, *, steps, limit, batch_size, optimizer, train="", loss="", lr_scheduler="",
             grad_clipper="", seed=7, extra="", mode="train"):
    """Trains keel's mlp; returns its step-0 and step-`steps` weights. `extra`: more manifest
    tables (then it names the run's hooks: none otherwise); `mode`: run.mode (evaluating needs
    a [data.test] in `extra`)."""
    run_dir = os.path.join(tmp, "run")
    manifest = f"""{extra if extra else "hooks = []"}

[run]
output_dir = "{run_dir}"
seed = {seed}
threads = 1
mode = "{mode}"

[train]
epochs = 0
max_steps = {steps}
{train}

[model]
type = "mlp"
hidden = {HIDDEN}

[data.train]
type = "fashion_mnist"
path = "{DATA_DIR}"
split = "train"
shuffle = false
limit = {limit}
batch_size = {batch_size}

[optimizer]
{optimizer}

[loss]
type = "cross_entropy"
{loss}

{lr_scheduler}

{grad_clipper}

[checkpoint]
type = "safetensors"
initial = true
at_end = true
"""
    path = os.path.join(tmp, "parity.toml")
    with open(path, "w") as f:
        f.write(manifest)
    p = subprocess.run([KEEL, "train", path], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        raise AssertionError(f"keel train failed ({p.returncode}):\n{p.stderr}\n{p.stdout}")
    ckpt = os.path.join(run_dir, "checkpoints")
    return (read_safetensors(os.path.join(ckpt, "step-0", "model.safetensors")),
            read_safetensors(os.path.join(ckpt, f"step-{steps}", "model.safetensors")))


def max_abs_diff(a, b):
    assert list(a) == list(b) or sorted(a) == sorted(b), (list(a), list(b))
    return max((a[k] - b[k]).abs().max().item() for k in a)


def loaded_library(pattern, maps):
    """Real path of the first mapped file whose name contains `pattern` (from /proc/PID/maps
    or ldd output), or None."""
    for line in maps.splitlines():
        for word in line.split():
            if word.startswith("/") and pattern in os.path.basename(word):
                return os.path.realpath(word)
    return None


class Parity(unittest.TestCase):
    def test_same_libraries(self):
        # Bit-identical results need the same LibTorch and BLAS code on both sides.
        with open("/proc/self/maps") as f:
            ours = f.read()
        theirs = subprocess.run(["ldd", KEEL], capture_output=True, text=True, check=True).stdout
        for lib in ("libtorch_cpu.so", "libblas.so"):
            mine, keel = loaded_library(lib, ours), loaded_library(lib, theirs)
            if lib == "libblas.so" and keel is None:
                # The wheel's LibTorch carries its BLAS (MKL) inside libtorch_cpu: neither side
                # loads a libblas.so.
                self.assertIsNone(mine, f"python maps {mine}, keel no libblas.so")
                continue
            self.assertIsNotNone(mine, f"python does not map {lib}")
            self.assertEqual(mine, keel, f"{lib}: python and keel load different files")

    def check(self, name, keel_start, keel_end, model, note="", atol=0.0):
        # atol 0: bit for bit (torch.equal); otherwise a max abs difference of at most atol.
        ours = {k: v.detach() for k, v in model.state_dict().items()}
        self.assertEqual(sorted(ours), sorted(keel_end))
        moved = max_abs_diff(keel_start, keel_end)
        self.assertGreater(moved, 1e-3, f"{name}: keel's weights barely moved: no training?")
        diff = max_abs_diff(ours, keel_end)
        print(f"\n  {name}: max |keel - pytorch| = {diff:.3e} (weights moved up to {moved:.3e}){note}",
              file=sys.stderr)
        for k in ours:
            self.assertEqual(ours[k].dtype, keel_end[k].dtype, f"{name}: {k}")
            if atol > 0:
                self.assertLessEqual((ours[k] - keel_end[k]).abs().max().item(), atol,
                                     f"{name}: {k} differs from PyTorch's by more than {atol}")
                continue
            self.assertTrue(torch.equal(ours[k], keel_end[k]),
                            f"{name}: {k} differs from PyTorch's (max abs diff "
                            f"{(ours[k] - keel_end[k]).abs().max().item():.3e}); "
                            "expected bit-identical")
        if atol == 0:
            self.assertEqual(diff, 0.0, f"{name}: parameters differ from PyTorch's")
        return diff

    def start(self, keel_start):
        model = mlp(HIDDEN)
        model.load_state_dict(keel_start, strict=True)
        model.train()
        return model

    def test_sgd_momentum_norm_clipping(self):
        # 16 steps per epoch, so the run crosses an epoch boundary. max_norm = 1.5 (not a power of
        # two) clips most steps but not all. clip_grad_norm_ writes max_norm / (total + 1e-6),
        # which Python evaluates as (total + 1e-6).reciprocal() * max_norm; keel's norm clipper
        # computes the coefficient with those same two operations, so clipping stays bit-identical.
        # keel's sgd is torch::optim::SGD, whose C++ step runs the tensor operations of
        # torch.optim.SGD's single-tensor path (foreach is off by default in 1.13), in order.
        steps, limit, bs, lr, max_norm = 24, 512, 32, 0.05, 1.5
        with tempfile.TemporaryDirectory() as tmp:
            k0, kn = run_keel(
                tmp, steps=steps, limit=limit, batch_size=bs,
                optimizer=f'type = "sgd"\nlr = {lr}\nmomentum = 0.9',
                grad_clipper=f'[grad_clipper]\ntype = "norm"\nmax_norm = {max_norm}')
        model = self.start(k0)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        data = batches(*fashion_mnist("train", limit), bs)
        norms = []
        for _ in range(steps):
            x, y = next(data)
            opt.zero_grad()
            F.cross_entropy(model(x.reshape(x.shape[0], -1)), y).backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item())
            opt.step()
        clipped = sum(n > max_norm for n in norms)
        self.assertGreater(clipped, 0, f"clipping never active: {norms}")
        self.check("sgd momentum 0.9 + norm clipping", k0, kn, model,
                   f"; clipped {clipped} of {steps} steps")

    def test_adamw_cosine_warmup_grad_accum(self):
        # keel's adamw is torch::optim::AdamW, whose C++ step runs the tensor operations of
        # torch.optim.AdamW's single-tensor path (foreach is off by default in 1.13) in the same
        # order (in 1.13; 2.x's uses lerp_: ADAM_ATOL). keel weights each micro-batch's loss by
        # its share of the items, 16 / 64 = 0.25,
        # and multiplies; the reference divides by 4: both are exact in binary floating point.
        steps, limit, bs, accum, lr, warmup = 20, 1024, 16, 4, 3e-3, 5  # 16 steps/epoch
        with tempfile.TemporaryDirectory() as tmp:
            k0, kn = run_keel(
                tmp, steps=steps, limit=limit, batch_size=bs, train=f"grad_accum = {accum}",
                optimizer=f'type = "adamw"\nlr = {lr}\nweight_decay = 0.05',
                lr_scheduler=f'[lr_scheduler]\ntype = "cosine"\nwarmup_steps = {warmup}\n'
                             f'min_factor = 0.1')
        model = self.start(k0)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(warmup, steps, 0.1))
        data = batches(*fashion_mnist("train", limit), bs)
        for _ in range(steps):
            opt.zero_grad()
            for _ in range(accum):
                x, y = next(data)
                (F.cross_entropy(model(x.reshape(x.shape[0], -1)), y) / accum).backward()
            opt.step()
            sched.step()
        self.check("adamw + cosine warmup + grad_accum 4", k0, kn, model, atol=ADAM_ATOL)

    def test_label_smoothing(self):
        # keel's adam is torch::optim::Adam (C++), like adamw above; its loss calls
        # torch::nn::functional::cross_entropy, which runs the ATen operator F.cross_entropy
        # runs (cross_entropy_loss) with the same label_smoothing.
        steps, limit, bs, lr = 20, 640, 32, 1e-3
        with tempfile.TemporaryDirectory() as tmp:
            k0, kn = run_keel(
                tmp, steps=steps, limit=limit, batch_size=bs,
                optimizer=f'type = "adam"\nlr = {lr}', loss="label_smoothing = 0.1")
        model = self.start(k0)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        data = batches(*fashion_mnist("train", limit), bs)
        for _ in range(steps):
            x, y = next(data)
            opt.zero_grad()
            F.cross_entropy(model(x.reshape(x.shape[0], -1)), y, label_smoothing=0.1).backward()
            opt.step()
        self.check("adam + label smoothing 0.1", k0, kn, model, atol=ADAM_ATOL)

    def test_token_normalized_accumulation_with_ignored_items(self):
        # keel multiplies each micro-batch's mean loss by the double n / total, as the reference
        # below does, so the scaled losses are the same floats.
        steps, limit, bs, accum, lr, ignore = 20, 1024, 16, 4, 0.05, 3
        with tempfile.TemporaryDirectory() as tmp:
            k0, kn = run_keel(
                tmp, steps=steps, limit=limit, batch_size=bs,
                train=f'grad_accum = {accum}\naccum_normalization = "auto"',
                optimizer=f'type = "sgd"\nlr = {lr}\nmomentum = 0.9',
                loss=f"ignore_index = {ignore}")

        def reference(normalize_by_items):
            model = self.start(k0)
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
            data = batches(*fashion_mnist("train", limit), bs)
            counts = set()
            for _ in range(steps):
                micro = [next(data) for _ in range(accum)]
                # Hugging Face's num_items_in_batch: the step's loss is the sum over its
                # micro-batches of (mean loss over the micro-batch's counted targets) times
                # (its count / the step's count), i.e. sum of per-target losses / total count.
                items = [int((y != ignore).sum()) for _, y in micro]
                total = sum(items)
                counts.update(items)
                opt.zero_grad()
                for (x, y), n in zip(micro, items):
                    loss = F.cross_entropy(model(x.reshape(x.shape[0], -1)), y,
                                           ignore_index=ignore)
                    (loss * (n / total) if normalize_by_items else loss / accum).backward()
                opt.step()
            self.assertGreater(len(counts), 1, "micro-batches all hold the same item count")
            return model

        model = reference(normalize_by_items=True)
        self.check("token-normalized grad_accum 4, ignore_index 3", k0, kn, model)
        naive = {k: v.detach() for k, v in reference(normalize_by_items=False).state_dict().items()}
        naive_diff = max_abs_diff(naive, kn)
        print(f"  (plain 1/k scaling would differ by {naive_diff:.3e})", file=sys.stderr)
        self.assertGreater(naive_diff, 1e-4,
                           "items and 1/k normalization agree: the test cannot tell them apart")

    def test_ema_against_averaged_model(self):
        # The ema hook (decay 0.9 with warm-up) over 50 SGD steps against
        # torch.optim.swa_utils.AveragedModel(use_buffers=True) with the same average, updated
        # after every step of the reference loop (which matches keel's weights bit for bit, as
        # above). Within 1e-6: the hook computes d and 1 - d in double before scaling float32
        # tensors, the reference's avg_fn in Python floats too, but the two may round a product
        # differently. The evaluation at the run's end (eval_with = "ema") must be the average's:
        # its loss equals the reference's loss of the averaged model on the same test samples
        # within 1e-6 relative, and differs from the trained model's; `keel evaluate` of the
        # step-50 checkpoint records the same loss (equal floats: the same weights, batch and
        # operations).
        from torch.optim.swa_utils import AveragedModel
        steps, limit, bs, lr, decay, test_limit = 50, 640, 32, 0.05, 0.9, 256
        with tempfile.TemporaryDirectory() as tmp:
            k0, kn = run_keel(
                tmp, steps=steps, limit=limit, batch_size=bs,
                optimizer=f'type = "sgd"\nlr = {lr}\nmomentum = 0.9',
                train="eval_each_epoch = false", mode="train_and_evaluate",
                extra=f"""[[hooks]]
type = "ema"
decay = {decay}
warmup = true
[[hooks]]
type = "jsonl"

[data.test]
type = "fashion_mnist"
path = "{DATA_DIR}"
split = "test"
shuffle = false
limit = {test_limit}
batch_size = {test_limit}
""")
            ckpt = os.path.join(tmp, "run", "checkpoints", f"step-{steps}")
            hooks = read_safetensors(os.path.join(ckpt, "hooks.safetensors"))
            with open(os.path.join(tmp, "run", "metrics.jsonl")) as f:
                records = [json.loads(line) for line in f]
            evals = [r for r in records if r["split"] == "test"]
            # `keel evaluate` of that checkpoint evaluates its average too (the hook's state).
            p = subprocess.run([KEEL, "evaluate", os.path.join(tmp, "parity.toml"), "--set",
                                f"checkpoint.init_from={ckpt}"], capture_output=True, text=True,
                               timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            (evaluated,) = glob.glob(os.path.join(tmp, "run", "eval-*", "metrics.jsonl"))
            with open(evaluated) as f:
                (evaluate_record,) = [json.loads(line) for line in f]
        model = self.start(k0)
        # n: the updates averaged before this one (AveragedModel's n_averaged, a tensor).
        average = AveragedModel(
            model, use_buffers=True,
            avg_fn=lambda e, w, n: (lambda d: d * e + (1 - d) * w)(
                min(decay, (1 + int(n)) / (10 + int(n)))))
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        data = batches(*fashion_mnist("train", limit), bs)
        for _ in range(steps):
            x, y = next(data)
            opt.zero_grad()
            F.cross_entropy(model(x.reshape(x.shape[0], -1)), y).backward()
            opt.step()
            average.update_parameters(model)
        self.check("sgd momentum 0.9 (the ema run's weights)", k0, kn, model)
        self.assertEqual(int(hooks["ema.updates"]), steps)
        ours = average.module.state_dict()
        diff = max((ours[k] - hooks["ema." + k]).abs().max().item() for k in ours)
        moved = max((ours[k] - kn[k]).abs().max().item() for k in ours)
        print(f"\n  ema: max |keel - AveragedModel| = {diff:.3e} (average vs weights: "
              f"{moved:.3e})", file=sys.stderr)
        self.assertEqual(sorted("ema." + k for k in ours) + ["ema.updates"], sorted(hooks))
        self.assertLessEqual(diff, 1e-6)
        self.assertGreater(moved, 1e-3, "the average equals the weights: nothing averaged")
        x, y = fashion_mnist("test", test_limit)
        with torch.no_grad():
            flat = x.reshape(x.shape[0], -1)
            ema_loss = F.cross_entropy(average.module.eval()(flat), y).item()
            model_loss = F.cross_entropy(model.eval()(flat), y).item()
        self.assertEqual([r["step"] for r in evals], [steps])
        print(f"  evaluation loss: keel {evals[0]['loss']:.7f}, AveragedModel {ema_loss:.7f}, "
              f"the trained model {model_loss:.7f}", file=sys.stderr)
        self.assertAlmostEqual(evals[0]["loss"], ema_loss, delta=1e-6 * abs(ema_loss))
        self.assertEqual(evaluate_record["loss"], evals[0]["loss"])
        self.assertGreater(abs(model_loss - ema_loss), 1e-4)

    def test_distill_against_pytorch(self):
        # The distill step (keel-steps) over 10 AdamW steps against the PyTorch reference of its
        # loss: a teacher (keel's mlp trained 20 SGD steps from seed 11, loaded frozen from that
        # run's checkpoint as [models.teacher]) and a student (seed 7),
        #   loss = alpha * F.kl_div(log_softmax(s / T), softmax(t / T), "batchmean") * T^2
        #          + (1 - alpha) * F.cross_entropy(s, y).
        # Within 1e-5 (the bound): the step's KL and cross entropy run the same ATen
        # operators as F.kl_div and F.cross_entropy, in an order of operations that may round
        # differently. The same reference without the distillation term must differ by more
        # (the term is active); the teacher's checkpoint is left as it was; a run resumed at
        # step 5 equals the uninterrupted one exactly (the teacher is read again from its
        # init_from, no random numbers are drawn for it); a step naming a model the run does
        # not have stops with one line naming the step and the model.
        steps, limit, bs, lr, alpha, temp = 10, 640, 32, 1e-3, 0.7, 2.5
        with tempfile.TemporaryDirectory() as tmp:
            teacher_tmp = os.path.join(tmp, "teacher")
            os.makedirs(teacher_tmp)
            run_keel(teacher_tmp, steps=20, limit=limit, batch_size=bs, seed=11,
                     optimizer='type = "sgd"\nlr = 0.05')
            teacher_ckpt = os.path.join(teacher_tmp, "run", "checkpoints", "step-20")
            teacher_weights = read_safetensors(os.path.join(teacher_ckpt, "model.safetensors"))
            k0, kn = run_keel(
                tmp, steps=steps, limit=limit, batch_size=bs,
                optimizer=f'type = "adamw"\nlr = {lr}',
                extra=f"""hooks = []

[step]
type = "distill"
alpha = {alpha}
temperature = {temp}

[models.teacher]
type = "mlp"
hidden = {HIDDEN}
init_from = "{teacher_ckpt}"
""")
            manifest = os.path.join(tmp, "parity.toml")
            again = os.path.join(tmp, "again")
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
            for argv in (["--set", "train.max_steps=5"], ["--resume"]):
                p = subprocess.run([KEEL, "train", manifest, "--set", f"run.output_dir={again}",
                                    *argv], capture_output=True, text=True, timeout=300, env=env)
                self.assertEqual(p.returncode, 0, p.stderr)
            resumed = read_safetensors(os.path.join(again, "checkpoints", f"step-{steps}",
                                                    "model.safetensors"))
            p = subprocess.run([KEEL, "train", manifest, "--set", f"run.output_dir={tmp}/bad",
                                "--set", 'step.teacher="techer"'], capture_output=True,
                               text=True, timeout=300, env=env)
            errors = [line for line in p.stderr.splitlines() if "error" in line]
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertEqual(len(errors), 1, p.stderr)
            self.assertIn("[step] step 'distill'", errors[0])
            self.assertIn("no model 'techer'", errors[0])
            self.assertIn("did you mean 'teacher'", errors[0])
            self.assertEqual(
                max_abs_diff(teacher_weights,
                             read_safetensors(os.path.join(teacher_ckpt, "model.safetensors"))),
                0.0)
        for k in kn:
            self.assertTrue(torch.equal(kn[k], resumed[k]), f"resumed at step 5: {k} differs")
        teacher = mlp(HIDDEN)
        teacher.load_state_dict(teacher_weights, strict=True)
        teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        model, plain = self.start(k0), self.start(k0)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        opt_plain = torch.optim.AdamW(plain.parameters(), lr=lr)
        data = batches(*fashion_mnist("train", limit), bs)
        for _ in range(steps):
            x, y = next(data)
            flat = x.reshape(x.shape[0], -1)
            opt.zero_grad()
            s = model(flat)
            with torch.no_grad():
                t = teacher(flat)
            kd = F.kl_div(F.log_softmax(s / temp, -1), F.softmax(t / temp, -1),
                          reduction="batchmean") * temp * temp
            (alpha * kd + (1 - alpha) * F.cross_entropy(s, y)).backward()
            opt.step()
            opt_plain.zero_grad()
            F.cross_entropy(plain(flat), y).backward()
            opt_plain.step()
        diff = self.check("distill (alpha 0.7, T 2.5) + adamw", k0, kn, model, atol=1e-5)
        without = max_abs_diff({k: v.detach() for k, v in plain.state_dict().items()}, kn)
        print(f"  without the distillation term: max |keel - pytorch| = {without:.3e}",
              file=sys.stderr)
        self.assertGreater(without, 100 * max(diff, 1e-7))


if __name__ == "__main__":
    t0 = time.time()
    result = unittest.main(argv=sys.argv[:1], verbosity=2, exit=False).result
    print(f"pytorch parity: {time.time() - t0:.1f} s", file=sys.stderr)
    sys.exit(0 if result.wasSuccessful() else 1)
