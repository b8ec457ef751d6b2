"""[distributed] shard = "optimizer" (ZeRO-1: each rank holds the optimizer state of its rows)
and "gradients" (ZeRO-2: and only its rows of the gradients, reduce-scattered).

Every case trains with AdamW, grad_accum 2, the `norm` clipper at max_norm 0.05 (so clipping
scales every step's gradients: the norm must be the whole gradients' on every rank) and
compares with the same manifest under shard = "none":
- a tiny gpt (tokens) on 2 ranks, 10 steps, each shard value: the final parameters within 1e-5
  (absolute, per element) and every step's loss within 1e-6 (relative, at least absolute);
  the run log names the shards and whether gradients are all-reduced or reduce-scattered, and
  its `collectives:` line counts the shard collectives of each step (an all-gather per bucket,
  the clipper's norm, a reduce-scatter per bucket and backward with "gradients"); the
  checkpoint holds one optimizer object per rank ("rank0.optimizer", "rank1.optimizer") whose
  moments have each rank's rows (ceil(rows / 2), the rest on rank 1), and no whole "optimizer".
  Every run keeps an `ema` hook's average (it reads the whole weights after each step, which
  both shard values leave on every rank): within 1e-5 of the "none" run's.
  Final parameters are read whole from each checkpoint's chunk index (every rank writes its
  rows: "model", "rank1.model"; safetensors_np.read_checkpoint).
- an MLP (fashion_mnist) on 3 ranks, 10 steps, each shard value, its biases in an
  [[optimizer.groups]] group of their own learning rate, with a layer of 10 rows (4, 4 and 2
  rows a rank) and one of 2 rows (1, 1 and none): the same tolerances.
- resume: the gpt 2-rank run stopped at step 5 and resumed with --resume ends with the
  uninterrupted run's parameters exactly (np.array_equal); resuming that checkpoint with
  shard = "none" (a change the log names) ends within 1e-5 of it.
- reshard: the gpt with [train] global_batch 12 and a cosine schedule, run 10 steps by 2 ranks
  with each shard of RESHARD_SAVE_SHARDS; its step-5 checkpoint resumed to step 10 by 1 rank
  (shard = "none") and by 3 ranks (the same shard): the final parameters within 1e-5 of the
  2-rank run's, its train records after step 5 with the same step, epoch, samples, tokens and
  lr, loss and grad_norm within 1e-5 (relative, at least absolute), and the log line saying the
  world size changed; a copy of the checkpoint whose commit.json drops one chunk of a tensor
  fails the resume with one error line naming the tensor and the missing rows.
- shard = "optimizer" with one process: a warning that the run holds everything as with "none",
  and the parameters of the "none" run exactly.
- a clipper built for ABI 1.1 (tests/fixtures/abi_1_1.c's abi11_noclip), which would take the
  norm of its rank's shards for the whole norm, is refused on 2 ranks with one error line naming
  both versions and the hint; with shard = "none" the same manifest trains.

- named batches (tests/fixtures/named_batch.cpp: dataset, model and loss through keel/ext/batch.h):
  2 ranks of batch_size 4 with each shard value ("none" being DDP) against 1 rank of batch_size 8
  (the same samples per step): the same tolerances.

shard = "parameters" (FSDP-style: between uses each rank holds only its rows of the parameters;
the model's units are gathered around their forward and backward), same tolerances:
- 2 ranks: the gpt above (2 blocks: 2 units and the root); the MLP, which declares no units
  (the warning naming it is asserted); units_mlp (tests/fixtures/units_model.cpp: a model with
  units built on the SDK's keel::Units).
- 3 ranks: a gpt of 4 blocks. Its records' param_mb_outside_unit (the kernel's count of rank
  0's resident parameter bytes outside the units being computed and the root) equal its rows of
  every parameter exactly (ceil(rows / 3) rows each), and param_mb_resident stays below the
  whole model.
- resume: the gpt 2-rank run stopped at step 5 and resumed (saving with [checkpoint] async =
  true) ends with the uninterrupted run's parameters exactly.
- errors, each one line: a unit's parameter that gets no gradient (named); param_unit out of
  range (a setup error naming the plugin); an `ema` hook (keel.hook.model/1 reads whole weights,
  which no rank holds) refused before step 1, naming the hook.

Usage: test_sharding.py KEEL_BINARY FIXTURE_DIR"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from launching import TORCHRUN, free_port, without_leak_checks, write_tokens
from safetensors_np import read_arrays, read_checkpoint, read_raw

KEEL, FIXTURES = sys.argv[1], sys.argv[2]
# Leak checking off for this file's keel processes under the sanitizers (launching.py says why).
ENV = without_leak_checks(os.environ)
CTX, VOCAB, WINDOWS = 8, 16, 160
# The shard modes test_reshard saves with (2 ranks) before resuming with 1 and 3.
RESHARD_SAVE_SHARDS = ("gradients", "parameters")

COMMON = """
[run]
name = "{name}"
seed = 11
threads = 1
output_dir = "{out}"
[train]
max_steps = {steps}
log_every = 1
grad_accum = 2
eval_each_epoch = false
{train}
[distributed]
shard = "{shard}"
[optimizer]
type = "adamw"
lr = 0.01
weight_decay = 0.1
{groups}
[grad_clipper]
type = "norm"
max_norm = 0.05
[checkpoint]
type = "safetensors"
every_steps = 5
[[hooks]]
type = "jsonl"
"""

GPT = """
[model]
type = "gpt"
vocab_size = {vocab}
context = {ctx}
layers = {layers}
heads = 2
width = 16
[data.train]
type = "tokens"
path = "{data}"
context = {ctx}
batch_size = 2
[loss]
type = "token_cross_entropy"
"""

MLP = """
[model]
type = "mlp"
hidden = [10, 2]
[data.train]
type = "fashion_mnist"
batch_size = 8
limit = 960
[loss]
type = "cross_entropy"
"""

# Batches of named tensors (tests/fixtures/named_batch.cpp): dataset, model and loss through
# their extensions of keel/ext/batch.h; batch_size from data_opts.
NAMED = """
[model]
type = "affine"
[data.train]
type = "weighted_points"
count = 160
{data_opts}
[loss]
type = "weighted_mse"
"""

UNITS = """
[model]
type = "units_mlp"
{model_opts}
[data.train]
type = "fashion_mnist"
batch_size = 8
limit = 960
[loss]
type = "cross_entropy"
"""


class Sharding(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        tokens = np.random.default_rng(4).integers(0, VOCAB, size=WINDOWS * CTX + 1)
        cls.data = write_tokens(cls.dir, tokens, VOCAB)
        cls.runs = {}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def manifest(self, name, model, shard, steps=10, groups="", head="", layers=2,
                 model_opts="", data_opts="", train=""):
        out = os.path.join(self.dir, name)
        if model in ("units", "named"):
            head += f'[plugins]\npaths = ["{self.fixture_plugins(model)}"]\n'
        body = head + COMMON.format(name=name, out=out, steps=steps, shard=shard, groups=groups,
                                    train=train)
        body += {"gpt": GPT, "mlp": MLP, "units": UNITS, "named": NAMED}[model].format(
            vocab=VOCAB, ctx=CTX, data=self.data, layers=layers, model_opts=model_opts,
            data_opts=data_opts)
        path = os.path.join(self.dir, name + ".toml")
        with open(path, "w") as f:
            f.write(body)
        return path, out

    def launch(self, path, nproc, *args, name="x", check=True, launcher=False):
        cmd = [KEEL, "train", path, *args]
        if nproc > 1 or launcher:
            cmd = TORCHRUN + [f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
                              f"--log_dir={os.path.join(self.dir, 'torchrun-' + name)}"] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
        if check:
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        return r

    def fixture_plugins(self, model):
        """A directory holding only the fixture of `model` (the plugin search path)."""
        plugins = os.path.join(self.dir, model + "-plugins")
        if not os.path.isdir(plugins):
            os.makedirs(plugins)
            library = {"units": "units_model.so", "named": "named_batch.so"}[model]
            shutil.copy(os.path.join(FIXTURES, library), plugins)
        return plugins

    def train(self, name, model, shard, nproc, steps=10, groups="", layers=2, launcher=False,
              head="", data_opts="", train=""):
        """Trains (once per name) and returns (final parameters, losses, run.log, run dir);
        under torchrun when nproc > 1 or launcher."""
        if name not in self.runs:
            path, out = self.manifest(name, model, shard, steps, groups, layers=layers, head=head,
                                      data_opts=data_opts, train=train)
            self.launch(path, nproc, name=name, launcher=launcher)
            self.runs[name] = out
        out = self.runs[name]
        model_t = read_checkpoint(os.path.join(out, "checkpoints", f"step-{steps}"))
        with open(os.path.join(out, "metrics.jsonl")) as f:
            losses = [r["loss"] for r in map(json.loads, f) if r.get("split") == "train"]
        with open(os.path.join(out, "run.log")) as f:
            log = f.read()
        return model_t, losses, log, out

    def assert_close(self, a, b, what, atol=1e-5):
        self.assertEqual(sorted(a), sorted(b))
        d = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)
        print(f"{what}: max |param diff| {d:.3g}")
        self.assertLessEqual(d, atol, what)

    def assert_losses(self, a, b, what):
        self.assertEqual(len(a), len(b))
        for x, y in zip(a, b):
            self.assertLessEqual(abs(x - y), 1e-6 * max(1.0, abs(x)), (what, a, b))

    # An `ema` hook reads the whole weights after every step (keel.hook.model/1), which every
    # rank holds under shard = "optimizer" and "gradients" too: its average matches shard "none".
    EMA = '[[hooks]]\ntype = "ema"\ndecay = 0.8\n'

    def test_gpt_two_ranks(self):
        none, none_l, none_log, none_out = self.train("gpt-none", "gpt", "none", 2, head=self.EMA)
        self.assertIn("gradients all-reduced in", none_log)
        for shard in ("optimizer", "gradients"):
            with self.subTest(shard=shard):
                self.check_gpt_two_ranks(none, none_l, none_out, shard)

    def check_gpt_two_ranks(self, none, none_l, none_out, shard):
        opt, opt_l, log, out = self.train("gpt-" + shard, "gpt", shard, 2, head=self.EMA)
        self.assertEqual(len(opt_l), 10)
        self.assert_losses(none_l, opt_l, "gpt, 2 ranks, " + shard)
        self.assert_close(none, opt, f"gpt, 2 ranks, {shard} vs none")
        ema = lambda o: read_arrays(os.path.join(o, "checkpoints", "step-10", "hooks.safetensors"))
        self.assertEqual(int(ema(out)["ema.updates"]), 10)
        self.assert_close(ema(none_out), ema(out), f"gpt, 2 ranks, {shard} vs none: ema average")
        self.assertIn(f'distributed.shard = "{shard}": ', log)
        self.assertIn("this rank's shards hold", log)
        # "gradients": reduce-scattered, not all-reduced.
        self.assertEqual("gradients all-reduced in" in log, shard == "optimizer")
        self.assertEqual("gradients reduce-scattered in" in log, shard == "gradients")
        # Per step: an all-gather per bucket, the clipper's norm, and with "gradients" a
        # reduce-scatter per bucket in each of the 2 micro-batches' backward.
        gathers = int(re.search(r"parameters in (\d+) all-gather bucket", log).group(1))
        scatters = re.search(r"gradients reduce-scattered in (\d+) bucket", log)
        per_step = gathers + 1 + (2 * int(scatters.group(1)) if scatters else 0)
        m = re.search(r"collectives: \d+ in (\d+) steps \([\d.]+ per step: \d+ agreements, "
                      r"\d+ gradient bucket all-reduces, (\d+) shard collectives", log)
        self.assertIsNotNone(m, log[-2000:])
        self.assertEqual((int(m.group(1)), int(m.group(2))), (10, 10 * per_step))
        ckpt = os.path.join(out, "checkpoints", "step-10")
        files = os.listdir(ckpt)
        self.assertNotIn("optimizer.safetensors", files)
        # Each rank's moments hold its rows of each parameter: ceil(rows / 2) on rank 0.
        for rank in (0, 1):
            header = read_raw(os.path.join(ckpt, f"rank{rank}.optimizer.safetensors"))
            moments = [k[:-len(".exp_avg")] for k in header if k.endswith(".exp_avg")]
            # Every parameter: 12 a layer, embeddings and the final LayerNorm.
            self.assertEqual(len(moments), 2 * 12 + 4, sorted(header))
            for name in moments:
                full = none[name]
                rows = full.shape[0] if full.ndim else 1
                chunk = (rows + 1) // 2
                mine = min(chunk, rows - min(rank * chunk, rows))
                shape = header[name + ".exp_avg"][1]
                self.assertEqual(shape[0] if full.ndim else 1, mine, (rank, name, shape))

    def test_mlp_three_ranks_with_groups(self):
        groups = '[[optimizer.groups]]\nparams = ".*bias"\nlr = 0.03'
        none, none_l, _, _ = self.train("mlp-none", "mlp", "none", 3, groups=groups)
        for shard in ("optimizer", "gradients"):
            opt, opt_l, _, _ = self.train("mlp-" + shard, "mlp", shard, 3, groups=groups)
            self.assert_losses(none_l, opt_l, "mlp, 3 ranks, " + shard)
            self.assert_close(none, opt, f"mlp, 3 ranks, {shard} vs none")
        # The layers of 10 and 2 rows: chunks 4/4/2 and 1/1/0.
        self.assertIn((10,), [a.shape for a in opt.values()])
        self.assertIn((2,), [a.shape for a in opt.values()])

    def test_resume(self):
        full, _, _, _ = self.train("gpt-optimizer", "gpt", "optimizer", 2)
        path, out = self.manifest("gpt-resume", "gpt", "optimizer", steps=5)
        self.launch(path, 2, name="resume-a")
        path, out = self.manifest("gpt-resume", "gpt", "optimizer", steps=10)
        self.launch(path, 2, "--resume", name="resume-b")
        resumed = read_checkpoint(os.path.join(out, "checkpoints", "step-10"))
        self.assertEqual(sorted(full), sorted(resumed))
        for k in full:
            self.assertTrue(np.array_equal(full[k], resumed[k]), k)
        # The same checkpoint without shards (another shard mode reshards it: test_reshard).
        path, out_c = self.manifest("gpt-resume-none", "gpt", "none", steps=10)
        r = self.launch(path, 2, "--resume", os.path.join(out, "checkpoints", "step-5"),
                        name="resume-c")
        self.assertIn('--resume: distributed.shard changed since the checkpoint ("optimizer" -> '
                      '"none")', r.stdout + r.stderr)
        none = read_checkpoint(os.path.join(out_c, "checkpoints", "step-10"))
        self.assert_close(full, none, "gpt, 2 ranks, optimizer saved, none resumed")

    def reshard_manifest(self, name, shard, steps):
        """The gpt with [train] global_batch = 12 (6, 3 and 2 micro-batches of 2 on 1, 2 and 3
        ranks) and a cosine schedule over the run: the same training at any number of ranks."""
        path, out = self.manifest(name, "gpt", shard, steps)
        with open(path) as f:
            text = f.read().replace("grad_accum = 2", "global_batch = 12")
            text = text.replace("[checkpoint]", '[lr_scheduler]\ntype = "cosine"\n[checkpoint]')
        with open(path, "w") as f:
            f.write(text)
        return path, out

    def train_records(self, out):
        with open(os.path.join(out, "metrics.jsonl")) as f:
            return [r for r in map(json.loads, f) if r.get("split") == "train"]

    def test_reshard(self):
        for shard in RESHARD_SAVE_SHARDS:
            with self.subTest(shard=shard):
                self.check_reshard(shard)

    def check_reshard(self, shard):
        """Saved at step 5 by 2 ranks with `shard`, resumed to step 10 by 1 rank (none) and by
        3 ranks (`shard`): the final parameters and the records of the uninterrupted 2-rank
        run."""
        ref_path, ref_out = self.reshard_manifest("reshard-ref-" + shard, shard, 10)
        self.launch(ref_path, 2, name="reshard-ref-" + shard)
        ref = read_checkpoint(os.path.join(ref_out, "checkpoints", "step-10"))
        ref_records = self.train_records(ref_out)
        saved = os.path.join(ref_out, "checkpoints", "step-5")  # [checkpoint] every_steps = 5
        with open(os.path.join(saved, "commit.json")) as f:
            record = json.load(f)
        self.assertEqual(record["version"], 2)
        self.assertIn("rank1.model", record["tensors"])
        for nproc, mode in ((1, "none"), (3, shard)):
            name = f"reshard-{shard}-{nproc}"
            p, o = self.reshard_manifest(name, mode, 10)
            r = self.launch(p, nproc, "--resume", saved, name=name)
            log = r.stdout + r.stderr
            self.assertIn(f"was saved by 2 rank(s) and this run has {nproc}", log)
            got = read_checkpoint(os.path.join(o, "checkpoints", "step-10"))
            self.assert_close(ref, got, f"gpt, saved by 2 ranks ({shard}), resumed by {nproc} "
                              f"({mode})")
            records = self.train_records(o)
            tail = [x for x in ref_records if x["step"] > 5]
            self.assertEqual([x["step"] for x in records], [x["step"] for x in tail])
            for a, b in zip(tail, records):
                for key in ("step", "epoch", "samples", "tokens", "lr"):
                    if key in a:
                        self.assertEqual(a[key], b[key], (key, a, b))
                for key in ("loss", "grad_norm"):
                    if key in a:
                        self.assertLessEqual(abs(a[key] - b[key]), 1e-5 * max(1, abs(a[key])),
                                             (key, a, b))
        # A commit record whose chunks leave rows of a tensor uncovered: one error line naming
        # the tensor and the rows.
        damaged = os.path.join(self.dir, "damaged-" + shard)
        shutil.copytree(saved, damaged)
        chunks = record["chunks"]["model"]
        name = next(n for n in sorted(chunks) if len(chunks[n]["chunks"]) == 2)
        rows = chunks[name]["chunks"][1]
        del chunks[name]["chunks"][1]
        with open(os.path.join(damaged, "commit.json"), "w") as f:
            json.dump(record, f)
        # Without its checksum file (as a record of a keel before issue 43 is, accepted with a
        # warning), so that what stops it is the coverage check, not the record's checksum.
        os.remove(os.path.join(damaged, "commit.json.xxh3"))
        p, _ = self.reshard_manifest("reshard-damaged-" + shard, "none", 10)
        r = self.launch(p, 1, "--resume", damaged, name="damaged", check=False)
        self.assertNotEqual(r.returncode, 0)
        errors = [l for l in (r.stdout + r.stderr).splitlines() if "error" in l.lower()]
        self.assertEqual(len(errors), 1, r.stdout[-3000:] + r.stderr[-3000:])
        first, count = rows["offset"][0], rows["size"][0]
        self.assertIn(f"model tensor '{name}' ", errors[0])
        self.assertIn(f"is not covered by its chunks (rows {first}..{first + count - 1} missing)",
                      errors[0])

    def test_old_clipper_refused(self):
        plugins = os.path.join(self.dir, "abi11")
        os.makedirs(plugins, exist_ok=True)
        shutil.copy(os.path.join(FIXTURES, "abi_1_1.so"), plugins)
        head = f'[plugins]\npaths = ["{plugins}"]\n'
        for shard, nproc in (("optimizer", 2), ("none", 1)):
            path, out = self.manifest("old-clip-" + shard, "gpt", shard, steps=2, head=head)
            with open(path) as f:
                body = f.read().replace('type = "norm"\nmax_norm = 0.05', 'type = "abi11_noclip"')
            with open(path, "w") as f:
                f.write(body)
            r = self.launch(path, nproc, name="old-clip-" + shard, check=shard == "none")
            if shard == "none":
                continue
            self.assertNotEqual(r.returncode, 0)
            errors = [l for l in r.stderr.splitlines() if "keel: error:" in l]
            self.assertTrue(errors, r.stderr[-3000:])
            self.assertIn("abi11_noclip", errors[0])
            self.assertIn("was built for plugin ABI 1.1, before sharded parameters (1.7)",
                          errors[0])
            self.assertIn('hint: rebuild it against this keel\'s SDK', errors[0])

    def test_one_process(self):
        none, _, _, _ = self.train("one-none", "gpt", "none", 1, steps=5)
        opt, _, log, _ = self.train("one-opt", "gpt", "optimizer", 1, steps=5)
        self.assertIn('distributed.shard = "optimizer" with one process: every parameter is '
                      'whole here, so the run holds everything as with "none"', log)
        for k in none:
            self.assertTrue(np.array_equal(none[k], opt[k]), k)
        # Under a launcher, one process with a shard mode forms a group of one and runs the
        # sharded step (the GPU check's one-rank NCCL line): same parameters as "none" within
        # 1e-6, the shards' log lines, and no group without a shard mode.
        for shard in ("gradients", "parameters"):
            with self.subTest(shard=shard):
                one, _, log, _ = self.train("one-torchrun-" + shard, "gpt", shard, 1, steps=5,
                                            launcher=True)
                self.assertIn("rank 0 of 1 (torchrun, local rank 0 of 1), gloo backend", log)
                self.assertIn(f'distributed.shard = "{shard}": ', log)
                self.assertNotIn("with one process", log)
                self.assert_close(none, one, f"gpt, torchrun 1 rank, {shard} vs none", atol=1e-6)
        _, _, log, _ = self.train("one-torchrun-none", "gpt", "none", 1, steps=5, launcher=True)
        self.assertNotIn("rank 0 of 1", log)

    def records(self, out):
        with open(os.path.join(out, "metrics.jsonl")) as f:
            return [r for r in map(json.loads, f) if r.get("split") == "train"]

    def test_parameters_two_ranks(self):
        none, none_l, _, _ = self.train("gpt-none", "gpt", "none", 2)
        for model in ("gpt", "mlp", "units"):
            with self.subTest(model=model):
                if model != "gpt":
                    none, none_l, _, _ = self.train(model + "2-none", model, "none", 2)
                fsdp, fsdp_l, log, out = self.train(model + "2-parameters", model,
                                                    "parameters", 2)
                self.assertEqual(len(fsdp_l), 10)
                self.assert_losses(none_l, fsdp_l, model + ", 2 ranks, parameters")
                self.assert_close(none, fsdp, f"{model}, 2 ranks, parameters vs none")
                self.assertIn('distributed.shard = "parameters": ', log)
                self.assertNotIn("gradients all-reduced in", log)
                units = re.search(r"(\d+) unit\(s\) with parameters", log)
                self.assertIsNotNone(units, log[-3000:])
                self.assertEqual(int(units.group(1)), {"gpt": 2, "mlp": 0, "units": 2}[model])
                warned = "declares no units (ABI 1.8 param_unit): distributed.shard = " \
                         '"parameters" gathers the whole model as one unit' in log
                self.assertEqual(warned, model == "mlp")
                if model == "mlp":
                    self.assertIn("[model] model 'mlp' (plugin keel-models): declares no units",
                                  log)
                for r in self.records(out):
                    self.assertGreater(r["param_mb_outside_unit"], 0)
                    self.assertGreaterEqual(r["param_mb_resident"], r["param_mb_outside_unit"])
        # "none" records no parameter accounting.
        self.assertNotIn("param_mb_outside_unit", self.records(self.runs["gpt-none"])[0])

    def test_named_batches(self):
        """Named batches on 2 ranks of batch_size 4, each shard value, and with micro_batch_size
        2 (shard "gradients"), against 1 rank of 8."""
        one, one_l, _, _ = self.train("named1", "named", "none", 1, data_opts="batch_size = 8")
        for shard in ("none", "optimizer", "gradients", "parameters"):
            with self.subTest(shard=shard):
                two, two_l, log, _ = self.train("named2-" + shard, "named", shard, 2,
                                                data_opts="batch_size = 4")
                self.assertEqual(len(two_l), 10)
                self.assert_losses(one_l, two_l, "named batches, 2 ranks, " + shard)
                self.assert_close(one, two, f"named batches, 2 ranks, {shard} vs 1 rank")
                if shard == "parameters":
                    self.assertIn("1 unit(s) with parameters", log)
        # [train] micro_batch_size 2: each rank's batch of 4 in two micro-batches.
        split, split_l, _, _ = self.train("named2-split", "named", "gradients", 2,
                                          data_opts="batch_size = 4",
                                          train="micro_batch_size = 2")
        self.assert_losses(one_l, split_l, "named batches, 2 ranks, micro_batch_size 2")
        self.assert_close(one, split, "named batches, 2 ranks, micro_batch_size 2 vs 1 rank")

    def test_step_two_ranks(self):
        """A [step] (distill from a frozen gpt teacher, trained here on 1 rank) on 2 ranks:
        "gradients" and "parameters" against "none" (the teacher whole on every rank)."""
        teacher = self.train("step-teacher", "gpt", "none", 1)[3]
        head = f"""[step]
type = "distill"
alpha = 0.6
temperature = 2.0
[models.teacher]
type = "gpt"
vocab_size = {VOCAB}
context = {CTX}
layers = 2
heads = 2
width = 16
init_from = "{os.path.join(teacher, 'checkpoints', 'step-10')}"
"""
        none, none_l, log, _ = self.train("step2-none", "gpt", "none", 2, head=head)
        self.assertIn("[step] step 'distill' (plugin keel-steps) computes each training "
                      "micro-batch's loss, running model, teacher", log)
        for shard in ("gradients", "parameters"):
            with self.subTest(shard=shard):
                two, two_l, _, _ = self.train("step2-" + shard, "gpt", shard, 2, head=head)
                self.assertEqual(len(two_l), 10)
                self.assert_losses(none_l, two_l, "distill, 2 ranks, " + shard)
                self.assert_close(none, two, f"distill, 2 ranks, {shard} vs none")

    def test_parameters_three_ranks(self):
        none, none_l, _, _ = self.train("gpt3-none", "gpt", "none", 3, layers=4)
        fsdp, fsdp_l, _, out = self.train("gpt3-parameters", "gpt", "parameters", 3, layers=4)
        self.assert_losses(none_l, fsdp_l, "gpt, 3 ranks, parameters")
        self.assert_close(none, fsdp, "gpt, 3 ranks, parameters vs none")
        # Rank 0's rows of every parameter (ceil(rows / 3) rows, padding included), float32.
        rows_mb = sum(-(-a.shape[0] // 3) * (a.size // a.shape[0]) if a.ndim else 1
                      for a in none.values()) * 4 / 2**20
        whole_mb = sum(a.size for a in none.values()) * 4 / 2**20
        records = self.records(out)
        self.assertEqual(len(records), 10)
        for r in records:
            print(f"step {r['step']}: param_mb_outside_unit {r['param_mb_outside_unit']:.6f}, "
                  f"param_mb_resident {r['param_mb_resident']:.6f} (rows {rows_mb:.6f}, whole "
                  f"model {whole_mb:.6f})")
            self.assertAlmostEqual(r["param_mb_outside_unit"], rows_mb, places=9)
            self.assertLess(r["param_mb_resident"], 0.8 * whole_mb)

    def test_parameters_resume(self):
        full, _, _, _ = self.train("gpt2-parameters", "gpt", "parameters", 2)
        path, out = self.manifest("gpt-parameters-resume", "gpt", "parameters", steps=5)
        self.launch(path, 2, name="parameters-resume-a")
        path, out = self.manifest("gpt-parameters-resume", "gpt", "parameters", steps=10)
        with open(path) as f:  # the second half saves in the background
            body = f.read().replace("every_steps = 5", "every_steps = 5\nasync = true")
        with open(path, "w") as f:
            f.write(body)
        self.launch(path, 2, "--resume", name="parameters-resume-b")
        resumed = read_checkpoint(os.path.join(out, "checkpoints", "step-10"))
        self.assertEqual(sorted(full), sorted(resumed))
        for k in full:
            self.assertTrue(np.array_equal(full[k], resumed[k]), k)

    def test_parameters_errors(self):
        cases = [
            ("dead", "units", "dead = true", 2,
             ["parameter 'fc1.unused' got no gradient",
              'distributed.shard = "parameters" needs one for every parameter']),
            ("bad-unit", "units", "bad_unit = 70000", 2,
             ["units_mlp", "units-model", "param_unit(0) returned 70000 for parameter "
              "'fc0.weight'; a unit is -1 (the root) or 0 <= unit < 65536"]),
            # A hook that reads the model's weights (keel.hook.model/1) while ranks hold shards.
            ("ema", "mlp", "", 2,
             ["[hooks[0]] hook 'ema' (plugin keel-hooks): reads the model's weights "
              "(keel.hook.model/1), which ranks hold only in shards under [distributed] shard = "
              '"parameters"; hint: use shard = "none", "gradients" or "optimizer"']),
        ]
        for name, model, opts, nproc, expected in cases:
            with self.subTest(case=name):
                path, _ = self.manifest("err-" + name, model, "parameters", steps=2,
                                        model_opts=opts,
                                        head='[[hooks]]\ntype = "ema"\n' if name == "ema" else "")
                r = self.launch(path, nproc, name="err-" + name, check=False)
                self.assertNotEqual(r.returncode, 0)
                errors = [l for l in r.stderr.splitlines() if "keel: error:" in l]
                self.assertTrue(errors, r.stderr[-3000:])
                for e in errors:  # one line per rank, each the whole message
                    for want in expected:
                        self.assertIn(want, e)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[3:], verbosity=2)
