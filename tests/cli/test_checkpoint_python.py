"""Checkpoints that Python reads without keel.

1. A run with [checkpoint] type = "torch" writes <run>/checkpoints/step-<N>/model.pt; Python's
   torch.load(weights_only=True) returns the state dict, which loads (strict=True) into an
   nn.Sequential built like keel's mlp, and that model's accuracy on the same Fashion-MNIST test
   samples equals the accuracy keel reported for its final evaluation in metrics.jsonl.
2. The same manifest with [checkpoint] type = "safetensors" (same seed, one thread: keel is
   deterministic) writes a model.safetensors whose tensors, read here with json, struct and numpy
   only, are bit for bit the tensors torch.load returned from the .pt file of run 1.
3. The other way: torch.save of that model's state dict starts a keel run ([checkpoint]
   init_from, with init_from_unverified = true: without, it is refused) that evaluates exactly
   as run 1's final evaluation.

Usage: test_checkpoint_python.py KEEL_BINARY SOURCE_ROOT

Runs with the Python of the LibTorch keel links (meson.build's torch_python: Debian's
/usr/bin/python3 with python3-torch 1.13, or the wheel's virtual environment)."""
import os

# One thread, as keel runs here ([run] threads = 1, which gives OpenBLAS one thread too),
# so that the Python forward pass runs the same kernels; set before `import torch`.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import collections
import json
import re
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
import torch

from fashion_mnist_torch import DATA_DIR, fashion_mnist
from safetensors_np import read_raw

torch.set_num_threads(1)

KEEL, ROOT = sys.argv[1], sys.argv[2]
HIDDEN = [64, 32]
TEST_LIMIT, TEST_BATCH = 10000, 100  # the whole test split


def manifest(run_dir, checkpoint_type):
    # 3 epochs of 4096 shuffled samples in batches of 64: 192 steps, evaluated after each epoch
    # (the final evaluation is at the last step, the step of the at_end checkpoint).
    return f"""
[run]
output_dir = "{run_dir}"
seed = 7
threads = 1

[train]
epochs = 3

[model]
type = "mlp"
hidden = {HIDDEN}

[data.train]
type = "fashion_mnist"
path = "{DATA_DIR}"
split = "train"
limit = 4096
batch_size = 64

[data.test]
type = "fashion_mnist"
path = "{DATA_DIR}"
split = "test"
limit = {TEST_LIMIT}
batch_size = {TEST_BATCH}
shuffle = false

[optimizer]
type = "adamw"
lr = 2e-3

[loss]
type = "cross_entropy"

[checkpoint]
type = "{checkpoint_type}"

[[hooks]]
type = "jsonl"
"""


def run_keel(tmp, checkpoint_type):
    run_dir = os.path.join(tmp, checkpoint_type)
    path = os.path.join(tmp, f"{checkpoint_type}.toml")
    with open(path, "w") as f:
        f.write(manifest(run_dir, checkpoint_type))
    p = subprocess.run([KEEL, "train", path], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError(f"keel train failed ({p.returncode}):\n{p.stderr}\n{p.stdout}")
    return run_dir


def final_checkpoint(run_dir):
    """(step, directory) of the committed checkpoint with the highest step: step-<N> or
    step-<N>-<runid>; staging directories (.step-<N>.tmp) do not match."""
    found = []
    for name in os.listdir(os.path.join(run_dir, "checkpoints")):
        m = re.fullmatch(r"step-(\d+)(-.+)?", name)
        if m:
            found.append((int(m.group(1)), os.path.join(run_dir, "checkpoints", name)))
    assert found, f"no committed checkpoint in {run_dir}/checkpoints"
    return max(found)


def final_eval(run_dir):
    """The last split "test" record of metrics.jsonl."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    evals = [r for r in records if r["split"] == "test"]
    assert evals, f"no evaluation record in {run_dir}/metrics.jsonl"
    return evals[-1]


# ---- keel's mlp (plugins/models/models.cpp) as an nn.Sequential ----

def mlp(hidden, in_features=784, classes=10):
    # keel's Mlp flattens in forward() (input.reshape(N, in_features)); nn.Flatten does the same
    # to [N, 1, 28, 28] and has no parameters, so the state dict names are keel's: fc1.weight,
    # fc1.bias, ..., with a ReLU (act<i>) after every layer but the last.
    widths = [in_features, *hidden, classes]
    layers = collections.OrderedDict(flatten=torch.nn.Flatten())
    for i in range(len(widths) - 1):
        layers[f"fc{i + 1}"] = torch.nn.Linear(widths[i], widths[i + 1])
        if i + 2 < len(widths):
            layers[f"act{i + 1}"] = torch.nn.ReLU()
    return torch.nn.Sequential(layers)


# ---- safetensors with json, struct and numpy only: tests/cli/safetensors_np.py ----

TORCH_DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                     torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                     torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def raw_bytes(tensor):
    """A CPU tensor's elements in row-major order as bytes in memory (little-endian here), as a
    uint8 array (bfloat16, which numpy lacks, through an int16 view of the same bits)."""
    t = tensor.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return np.frombuffer(t.numpy().tobytes(), dtype=np.uint8)


class CheckpointsInPython(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(cls.tmp.cleanup)
        t0 = time.time()
        cls.torch_run = run_keel(cls.tmp.name, "torch")
        cls.safetensors_run = run_keel(cls.tmp.name, "safetensors")
        print(f"\n  two keel runs: {time.time() - t0:.1f} s", file=sys.stderr)
        cls.step, directory = final_checkpoint(cls.torch_run)
        # keel writes the dict as Python's torch.save does, naming only globals that
        # torch.load(weights_only=True) allows (in torch 1.13 and 2.x alike).
        cls.state = torch.load(os.path.join(directory, "model.pt"), weights_only=True)

    def test_torch_load_gives_the_state_dict_of_the_evaluated_model(self):
        self.assertIs(type(self.state), dict)
        self.assertEqual(list(self.state),
                         ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight",
                          "fc3.bias"])
        model = mlp(HIDDEN)
        model.load_state_dict(self.state, strict=True)
        model.eval()

        record = final_eval(self.torch_run)
        self.assertEqual(record["step"], self.step, "the final evaluation is not at the step "
                         "of the final checkpoint")
        self.assertEqual(record["samples"], TEST_LIMIT)

        # keel's evaluation, written out again: the same batches in the same order, argmax over
        # the logits, accuracy = correct / rows, loss = sum(batch mean loss * rows) / rows.
        x, y = fashion_mnist("test", TEST_LIMIT)
        correct, loss_sum = 0, 0.0
        with torch.no_grad():
            for i in range(0, TEST_LIMIT, TEST_BATCH):
                out = model(x[i:i + TEST_BATCH])
                target = y[i:i + TEST_BATCH]
                correct += int(out.argmax(1).eq(target).sum())
                loss_sum += torch.nn.functional.cross_entropy(out, target).item() * len(target)
        accuracy, loss = correct / TEST_LIMIT, loss_sum / TEST_LIMIT
        print(f"  step {self.step}: keel accuracy {record['accuracy']:.4f}, python "
              f"{accuracy:.4f}; loss {record['loss']!r} vs {loss!r}", file=sys.stderr)
        self.assertGreater(accuracy, 0.6, "the model barely trained: the comparison would be weak")
        # One sample changing class moves the accuracy by 1 / 10000, so 1e-6 means every one of
        # the 10000 predictions agrees: the comparison is exact in effect.
        self.assertAlmostEqual(accuracy, record["accuracy"], delta=1e-6)
        self.assertAlmostEqual(loss, record["loss"], delta=1e-6 * abs(loss))

    def test_safetensors_of_the_same_run_holds_the_same_bits(self):
        # Same manifest and seed: the two runs must have trained the same model.
        ours, theirs = final_eval(self.safetensors_run), final_eval(self.torch_run)
        for key in ("step", "loss", "accuracy"):
            self.assertEqual(ours[key], theirs[key], key)
        step, directory = final_checkpoint(self.safetensors_run)
        self.assertEqual(step, self.step)
        st = read_raw(os.path.join(directory, "model.safetensors"))
        self.assertEqual(list(st), list(self.state))
        for name, tensor in self.state.items():
            dtype, shape, raw = st[name]
            self.assertEqual(dtype, TORCH_DTYPE_NAMES[tensor.dtype], name)
            self.assertEqual(shape, list(tensor.shape), name)
            self.assertTrue(np.array_equal(raw, raw_bytes(tensor)),
                            f"{name}: the bytes in model.safetensors differ from model.pt's")

    def test_a_state_dict_from_torch_save_starts_a_keel_run(self):
        # What Python writes for a model: torch.save of its state dict, an OrderedDict with
        # _metadata, in a directory without keel's commit record. keel's torch backend reads it
        # (with init_from_unverified = true: refused without) into the same weights.
        model = mlp(HIDDEN)
        model.load_state_dict(self.state, strict=True)
        source = os.path.join(self.tmp.name, "from-python")
        os.mkdir(source)
        torch.save(model.state_dict(), os.path.join(source, "model.pt"))
        run_dir = os.path.join(self.tmp.name, "from-python-run")
        path = os.path.join(self.tmp.name, "from-python.toml")
        with open(path, "w") as f:
            f.write(manifest(run_dir, "torch"))
        # One step at lr 0 (AdamW's decay is scaled by lr too), then the final evaluation.
        args = [KEEL, "train", path, "--set", f"checkpoint.init_from={source}", "--set",
                "optimizer.lr=0", "--set", "train.epochs=1", "--set", "data.train.limit=64",
                "--set", "checkpoint.at_end=false"]
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("has no commit record", p.stderr)
        self.assertIn("hint: if you trust its files, set [checkpoint] init_from_unverified = "
                      "true", p.stderr)
        p = subprocess.run(args + ["--set", "checkpoint.init_from_unverified=true"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        ours, theirs = final_eval(run_dir), final_eval(self.torch_run)
        self.assertEqual(ours["loss"], theirs["loss"])
        self.assertEqual(ours["accuracy"], theirs["accuracy"])


if __name__ == "__main__":
    t0 = time.time()
    result = unittest.main(argv=sys.argv[:1], verbosity=2, exit=False).result
    print(f"checkpoint python: {time.time() - t0:.1f} s", file=sys.stderr)
    sys.exit(0 if result.wasSuccessful() else 1)
