"""Plugins that break the contract: each case swaps one misbehaving component (from the fixtures
in tests/fixtures/misbehave/: the plain C plugin misbehave-c and the C++ SDK plugin
misbehave-cpp) into a short quickstart run and checks that keel fails cleanly: exit status 1,
no signal, exactly one stderr line `keel: error: [<section>] <kind> '<name>' (plugin <plugin>):
...` that names the call and says what was wrong, and no backtrace, std::terminate or internal
error.

The cases run in-process: keel_inproc (tests/cli/keel_inproc.cpp, driven by tests/cli/inproc.py) calls
keel::cli_main, the function the `keel` executable runs, once per case in KEEL_TEST_JOBS
long-lived processes (default: the number of cores), and reports any process-global state a case
left changed (a leak fails the case). A fixed sample (PROCESS_SAMPLE) also runs as keel
processes, with the same exit status, stderr and stdout (numbers aside) required; under the
sanitizers (ASAN_OPTIONS set) no case does. Each keel_inproc must exit 0 (under the sanitizers,
LeakSanitizer reports at exit).

Usage: test_misbehave.py KEEL_BINARY SOURCE_ROOT MISBEHAVE_FIXTURE_DIR KEEL_INPROC
[unittest args]"""
import concurrent.futures
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest
from typing import Dict, NamedTuple, Tuple

import inproc

KEEL, ROOT, FIXTURES, INPROC = (os.path.abspath(a) for a in sys.argv[1:5])
TIMEOUT_S = 120
C, CPP = "misbehave-c", "misbehave-cpp"

# The manifest section each component kind is swapped into, and the kind's name in messages.
KIND_OF_SECTION = {
    "model": "model", "data.train": "dataset", "optimizer": "optimizer",
    "lr_scheduler": "lr_scheduler", "loss": "loss", "grad_clipper": "grad_clipper",
    "mfu": "mfu", "checkpoint": "checkpoint", "hooks[0]": "hook",
}


class Case(NamedTuple):
    name: str
    plugin: str             # C or CPP
    section: str            # manifest section the component goes in
    type: str               # component name
    fault: str              # value of its `fault` option
    call: str               # the call the error line names (after the label)
    phrases: Tuple[str, ...]  # what was wrong: each must appear in the line
    extra: str = ""         # more manifest text
    names: bool = True      # the line names section, component, plugin and call


# The other half of the forward_features / compute_linear pair, behaving.
LINEAR_LOSS = '[loss]\ntype = "mbx_loss"\nfault = "none"\n'
LINEAR_MODEL = '[model]\ntype = "mbx_model"\nfault = "none"\n'

CASES = [
    # loss ------------------------------------------------------------------------------------
    Case("loss_null_tensor", C, "loss", "mbc_loss", "null_loss", "compute",
         ("compute returned no loss tensor",)),
    Case("loss_integer_dtype", C, "loss", "mbc_loss", "integer", "compute", ("floating-point",)),
    Case("loss_not_requiring_grad_c", C, "loss", "mbc_loss", "detached", "compute",
         ("does not require grad",)),
    Case("loss_empty_error_message", C, "loss", "mbc_loss", "empty_error", "compute",
         ("failed without a message",)),
    Case("loss_struct_size_too_small", C, "loss", "mbc_loss", "struct_small", "creation",
         ("instance struct is",)),
    Case("loss_not_scalar", CPP, "loss", "mbx_loss", "non_scalar", "compute",
         ("expected a scalar loss",)),
    Case("loss_detached", CPP, "loss", "mbx_loss", "detached", "compute",
         ("does not require grad",)),
    Case("loss_throws", CPP, "loss", "mbx_loss", "compute_throw", "compute",
         ("deliberate failure in compute",)),
    # Already handled by the loop's non-finite check, which names no component.
    Case("loss_nan_nonfinite_error", CPP, "loss", "mbx_loss", "nan", "", ("non-finite loss",),
         extra="[train]\nnonfinite = \"error\"\n", names=False),
    # model -----------------------------------------------------------------------------------
    Case("model_factory_ok_without_instance", C, "model", "mbc_model", "factory_null",
         "creation", ("no instance",)),
    Case("model_no_parameters", C, "model", "mbc_model", "param_count_zero", "param_count",
         ("no trainable parameters",)),
    Case("model_param_null_name", C, "model", "mbc_model", "param_null_name", "param",
         ("param", "NULL")),
    Case("model_param_null_tensor", C, "model", "mbc_model", "param_null_tensor", "param",
         ("param", "NULL")),
    Case("model_param_empty_error_message", C, "model", "mbc_model", "param_empty_error",
         "param", ("failed without a message",)),
    Case("model_param_not_requiring_grad", C, "model", "mbc_model", "param_no_grad", "param",
         ("requires grad",)),
    Case("model_forward_null", CPP, "model", "mbx_model", "forward_null", "forward",
         ("forward returned no tensor",)),
    Case("model_output_batch_dim", CPP, "model", "mbx_model", "batch_dim", "forward",
         ("first dimension",)),
    Case("model_duplicate_param_names", CPP, "model", "mbx_model", "duplicate_names", "param",
         ("duplicate parameter name", "linear.weight")),
    Case("model_constructor_throws", CPP, "model", "mbx_model", "ctor_throw", "creation",
         ("deliberate failure in constructor",)),
    Case("model_forward_throws", CPP, "model", "mbx_model", "forward_throw", "forward",
         ("deliberate failure in forward",)),
    Case("model_set_training_throws", CPP, "model", "mbx_model", "set_training_throw",
         "set_training", ("deliberate failure in set_training",)),
    Case("model_forward_c10_error", CPP, "model", "mbx_model", "c10_error", "forward",
         ("cannot be multiplied",)),
    Case("model_forward_bad_alloc", CPP, "model", "mbx_model", "bad_alloc", "forward",
         ("bad_alloc",)),
    # model forward_features and loss compute_linear (ABI 1.5): used together in training steps
    Case("model_features_null", CPP, "model", "mbx_model", "features_null", "forward_features",
         ("forward_features returned no features",), extra=LINEAR_LOSS),
    Case("model_features_shape", CPP, "model", "mbx_model", "features_shape", "forward_features",
         ("features [64, 784] and weight [10, 783]", "expected features [batch (64), ..., F] and "
          "weight [V, F]"), extra=LINEAR_LOSS),
    Case("model_features_throws", CPP, "model", "mbx_model", "features_throw", "forward_features",
         ("deliberate failure in forward_features",), extra=LINEAR_LOSS),
    Case("loss_linear_throws", CPP, "loss", "mbx_loss", "linear_throw", "compute_linear",
         ("deliberate failure in compute_linear",), extra=LINEAR_MODEL),
    Case("loss_linear_detached", CPP, "loss", "mbx_loss", "linear_detached", "compute_linear",
         ("compute_linear returned a loss that does not require grad",), extra=LINEAR_MODEL),
    # dataset ---------------------------------------------------------------------------------
    Case("data_batch_without_inputs", C, "data.train", "mbc_data", "null_inputs", "next",
         ("without inputs",)),
    Case("data_batch_without_targets", C, "data.train", "mbc_data", "null_targets", "next",
         ("without targets",)),
    Case("data_batch_zero_samples", C, "data.train", "mbc_data", "zero_samples", "next",
         ("samples",)),
    Case("data_inputs_targets_first_dim", C, "data.train", "mbc_data", "mismatched", "next",
         ("first dimension",)),
    Case("data_no_batches_per_epoch", C, "data.train", "mbc_data", "no_batches",
         "batches_per_epoch", ("no batches",)),
    Case("data_empty_error_message", C, "data.train", "mbc_data", "next_empty_error", "next",
         ("failed without a message",)),
    Case("data_stopped_without_a_stop", C, "data.train", "mbc_data", "stopped_unasked", "next",
         ("KEEL_BATCH_STOPPED", "but no stop was requested", "keel_host.stop_requested")),
    # optimizer -------------------------------------------------------------------------------
    Case("optimizer_group_count_zero", C, "optimizer", "mbc_optimizer", "group_count_zero",
         "group_count", ("group_count",)),
    Case("optimizer_get_lr_nan", C, "optimizer", "mbc_optimizer", "get_lr_nan", "get_lr",
         ("get_lr",)),
    Case("optimizer_required_slot_null", C, "optimizer", "mbc_optimizer", "slot_null",
         "creation", ("slot 'zero_grad' is NULL",)),
    Case("optimizer_zero_grad_throws", CPP, "optimizer", "mbx_optimizer", "zero_grad_throw",
         "zero_grad", ("deliberate failure in zero_grad",)),
    Case("optimizer_step_throws", CPP, "optimizer", "mbx_optimizer", "step_throw", "step",
         ("deliberate failure in step",)),
    Case("optimizer_set_lr_throws", CPP, "optimizer", "mbx_optimizer", "set_lr_throw", "set_lr",
         ("deliberate failure in set_lr",)),
    # optimizer state for checkpoints (ABI 1.3 state_save): entries the kernel refuses, at the
    # at_end checkpoint; nothing half-written is left
    Case("optimizer_state_duplicate_name", CPP, "optimizer", "mbx_optimizer", "state_duplicate",
         "state_save", ("entry 'lr' was put twice",)),
    Case("optimizer_state_empty_name", CPP, "optimizer", "mbx_optimizer", "state_empty_name",
         "state_save", ("NULL or empty name",)),
    Case("optimizer_state_long_name", CPP, "optimizer", "mbx_optimizer", "state_long_name",
         "state_save", ("longer than 255 bytes",)),
    Case("optimizer_state_null_tensor", CPP, "optimizer", "mbx_optimizer", "state_null",
         "state_save", ("entry 'lr' has a NULL tensor",)),
    # lr_scheduler ----------------------------------------------------------------------------
    Case("scheduler_factor_nan", C, "lr_scheduler", "mbc_scheduler", "factor_nan", "factor",
         ("factor", "nan")),
    Case("scheduler_factor_negative", C, "lr_scheduler", "mbc_scheduler", "factor_negative",
         "factor", ("factor", "-0.5")),
    Case("scheduler_factory_empty_error_message", C, "lr_scheduler", "mbc_scheduler",
         "factory_empty_error", "creation", ("failed without a message",)),
    Case("scheduler_factor_throws", CPP, "lr_scheduler", "mbx_scheduler", "factor_throw",
         "factor", ("deliberate failure in factor",)),
    # grad_clipper ----------------------------------------------------------------------------
    Case("clipper_negative_norm", C, "grad_clipper", "mbc_clipper", "negative", "clip",
         ("clip", "-1")),
    # NaN goes to the non-finite policy (the gradients may hold NaN), which names no component.
    Case("clipper_nan_norm", C, "grad_clipper", "mbc_clipper", "nan", "",
         ("non-finite gradient norm", "grad norm nan"), names=False),
    # mfu -------------------------------------------------------------------------------------
    Case("mfu_nan", C, "mfu", "mbc_mfu", "nan", "compute", ("mfu", "returned", "nan")),
    Case("mfu_negative", C, "mfu", "mbc_mfu", "negative", "compute", ("mfu", "returned", "-0.5")),
    Case("mfu_infinite", C, "mfu", "mbc_mfu", "inf", "compute", ("mfu", "returned", "inf")),
    # the peak it reports (ABI 1.4 peak_flops), checked once when the run is set up
    Case("mfu_peak_nan", C, "mfu", "mbc_mfu", "peak_nan", "peak_flops",
         ("peak_flops returned nan", "finite FLOP/s value > 0")),
    Case("mfu_peak_zero", C, "mfu", "mbc_mfu", "peak_zero", "peak_flops",
         ("peak_flops returned 0", "finite FLOP/s value > 0")),
    Case("mfu_throws", CPP, "mfu", "mbx_mfu", "compute_throw", "compute",
         ("deliberate failure in mfu compute",)),
    # hooks -----------------------------------------------------------------------------------
    Case("hook_on_event_fails", C, "hooks[0]", "mbc_hook", "fail", "on_event",
         ("deliberate hook failure at STEP_END of step 1",)),
    Case("hook_empty_error_message", C, "hooks[0]", "mbc_hook", "empty_error", "on_event",
         ("failed without a message",)),
    Case("hook_unknown_request_bits", C, "hooks[0]", "mbc_hook", "unknown_bits", "on_event",
         ("unknown request bits",)),
    Case("hook_on_event_throws", CPP, "hooks[0]", "mbx_hook", "on_event_throw", "on_event",
         ("deliberate failure in on_event",)),
    # checkpoint ------------------------------------------------------------------------------
    Case("checkpoint_save_fails", C, "checkpoint", "mbc_checkpoint", "save_fail", "save",
         ("deliberate failure after writing part of the checkpoint",)),
]

STEPS = 3


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def base_manifest(d):
    """A short quickstart run that loads plugins from the misbehave fixtures' directory only
    (besides keel's own)."""
    path = os.path.join(d, "base.toml")
    write(path, f'''extends = "{ROOT}/configs/quickstart.toml"
[plugins]
paths = ["{FIXTURES}"]
[run]
threads = 1
[train]
max_steps = {STEPS}
log_every = 1
[data.train]
limit = 256
[data.test]
limit = 100
[lr_scheduler]
warmup_steps = 1
''')
    return path


def component_table(section, type_, fault):
    header = "[[hooks]]" if section == "hooks[0]" else f"[{section}]"
    return f'{header}\ntype = "{type_}"\nfault = "{fault}"\n'


def keel(*args):
    # argv[0] "keel", as the in-process cases get: hints name keel as it was run.
    p = subprocess.run(["keel", *args], executable=KEEL, capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    return p.returncode, p.stdout, p.stderr


# The cases that also run as keel processes: every 6th; none under the sanitizers (meson's
# 'sanitizers' test setup sets ASAN_OPTIONS), where the sample's point, the in-process runner's
# fidelity, is not what is checked and each keel process costs seconds to start.
SANITIZED = inproc.SANITIZED
PROCESS_SAMPLE = frozenset() if SANITIZED else frozenset(c.name for c in CASES[::6])


class Run(NamedTuple):
    rc: object  # None: hung
    out: str
    err: str
    leaks: Tuple[str, ...]


def case_manifest(base, d, case):
    os.mkdir(d)
    manifest = os.path.join(d, "m.toml")
    write(manifest, f'extends = "{base}"\n' +
          component_table(case.section, case.type, case.fault) + case.extra)
    return manifest


def run_all(base, tmp):
    """Every case in-process (and the sample as processes too): {(name, mode): (Run, dir)}."""
    jobs = int(os.environ.get("KEEL_TEST_JOBS", os.cpu_count() or 1))
    pool = inproc.Pool(INPROC, TIMEOUT_S)
    work = [(c, "inproc") for c in CASES] + [(c, "process") for c in CASES
                                              if c.name in PROCESS_SAMPLE]

    def one(w):
        case, mode = w
        d = os.path.join(tmp, f"{case.name}-{mode}")
        args = ("train", case_manifest(base, d, case), "--set", f"run.output_dir={d}/run")
        if mode == "inproc":
            o = pool.run(["keel", *args], cwd=tmp)
            return Run(o.returncode, o.stdout, o.stderr, tuple(o.leaks)), d
        try:
            rc, out, err = keel(*args)
        except subprocess.TimeoutExpired as e:
            rc, out, err = None, str(e.stdout or ""), str(e.stderr or "")
        return Run(rc, out, err, ()), d

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
            results = dict(zip(((c.name, m) for c, m in work), ex.map(one, work)))
    finally:
        problems = pool.close()
    print(f"\ntest_misbehave: {len(work)} keel runs: {len(CASES)} in-process, "
          f"{len(work) - len(CASES)} as keel processes", file=sys.stderr)
    return results, problems


class Misbehaviour(unittest.TestCase):
    """One test per entry of CASES (added below)."""

    results: Dict = {}
    runner_problems = []

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.base = base_manifest(cls.tmp.name)
        cls.results, cls.runner_problems = run_all(cls.base, cls.tmp.name)

    def test_runners_exit_clean(self):
        """Every keel_inproc ended with status 0 (under the sanitizers: no leak at exit)."""
        self.assertEqual(self.runner_problems, [])

    def test_inproc_matches_process(self):
        """The sample run both ways: the same exit status, stderr and stdout (numbers aside)."""
        if SANITIZED:
            self.skipTest("no process sample under the sanitizers")
        self.assertGreaterEqual(len(PROCESS_SAMPLE), 10)
        for name in sorted(PROCESS_SAMPLE):
            (a, da), (b, db) = self.results[(name, "inproc")], self.results[(name, "process")]
            with self.subTest(case=name):
                self.assertEqual(
                    (a.rc, inproc.normalized(a.err, da), inproc.normalized(a.out, da, digits=True)),
                    (b.rc, inproc.normalized(b.err, db), inproc.normalized(b.out, db, digits=True)))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_case(self, case: Case, mode: str):
        (rc, out, err, leaks), d = self.results[(case.name, mode)]
        report = f"\n--- case {case.name} ({mode}): exit {rc}\n--- stderr:\n{err}--- stdout " \
                 "(tail):\n" + "\n".join(out.splitlines()[-5:])
        self.assertIsNotNone(rc, f"keel hung (killed after {TIMEOUT_S} s)" + report)
        self.assertEqual(leaks, (), "process-global state left changed" + report)
        self.assertEqual(rc, 1, "expected exit status 1" + report)
        lines = err.strip().splitlines()
        self.assertEqual(len(lines), 1, "expected exactly one stderr line" + report)
        line = lines[0]
        self.assertTrue(line.startswith("keel: error: "), report)
        if case.names:
            label = (f"keel: error: [{case.section}] {KIND_OF_SECTION[case.section]} "
                     f"'{case.type}' (plugin {case.plugin}): ")
            self.assertTrue(line.startswith(label), f"the line must start with {label!r}" + report)
            self.assertRegex(line[len(label):], rf"\b{case.call}\b",
                             f"the line must name the call {case.call!r}" + report)
        for phrase in case.phrases:
            self.assertIn(phrase, line, report)
        for bad in ("Exception raised from", "terminate called", "internal error"):
            self.assertNotIn(bad, err + out, report)
        return d

    def check_checkpoint_save_fails(self, d):
        # The commit protocol: nothing half-written survives a failing backend.
        ckpt = os.path.join(d, "run", "checkpoints")
        names = os.listdir(ckpt) if os.path.isdir(ckpt) else []
        left = [n for n in names if n.startswith(("step-", ".step-"))]
        self.assertEqual(left, [], f"a failed save left {left} in {ckpt}")


class ResumeWithoutOptimizerState(unittest.TestCase):
    def test_resume_refuses_an_optimizer_without_state_slots(self):
        # mbc_optimizer (plain C, ABI 1.3 struct) leaves state_save / state_load NULL: its run
        # saves checkpoints, but --resume must refuse rather than go on with fresh moments.
        with tempfile.TemporaryDirectory() as d:
            manifest = os.path.join(d, "m.toml")
            write(manifest, f'extends = "{base_manifest(d)}"\n' +
                  component_table("optimizer", "mbc_optimizer", "none"))
            run = ["--set", f"run.output_dir={d}/run"]
            rc, out, err = keel("train", manifest, *run)
            self.assertEqual(rc, 0, err)
            rc, out, err = keel("train", manifest, *run, "--resume", "--set", "train.max_steps=5")
            self.assertEqual(rc, 1, err)
            lines = err.strip().splitlines()
            self.assertEqual(len(lines), 1, err)
            self.assertTrue(lines[0].startswith(
                "keel: error: [optimizer] optimizer 'mbc_optimizer' (plugin misbehave-c): has no "
                "state_save/state_load slots (ABI 1.3)"), lines[0])
            self.assertIn("hint: ", lines[0])


for _name in ("optimizer_state_duplicate_name", "optimizer_state_empty_name",
              "optimizer_state_long_name", "optimizer_state_null_tensor"):
    setattr(Misbehaviour, "check_" + _name, Misbehaviour.check_checkpoint_save_fails)


def make_test(case):
    def test(self):
        for mode in ("inproc", "process") if case.name in PROCESS_SAMPLE else ("inproc",):
            with self.subTest(mode=mode):
                d = self.run_case(case, mode)
                extra = getattr(self, "check_" + case.name, None)
                if extra:
                    extra(d)
    test.__doc__ = f"{case.plugin} [{case.section}] {case.type} fault={case.fault}"
    return test


for _case in CASES:
    setattr(Misbehaviour, "test_" + _case.name, make_test(_case))


class WellBehaved(unittest.TestCase):
    """The same components with fault = "none" train: the failures above come from the faults."""

    def train(self, tables):
        with tempfile.TemporaryDirectory() as d:
            base = base_manifest(d)
            m = os.path.join(d, "m.toml")
            write(m, f'extends = "{base}"\n' + tables)
            rc, out, err = keel("train", m, "--set", f"run.output_dir={d}/run")
            self.assertEqual((rc, err), (0, ""), out)
            with open(f"{d}/run/metrics.jsonl") as f:
                records = [json.loads(line) for line in f]
            train = [r for r in records if r["split"] == "train"]
            self.assertEqual(train[-1]["step"], STEPS)
            self.assertTrue(all(math.isfinite(r["loss"]) for r in train), train)
            return records, sorted(os.listdir(f"{d}/run/checkpoints"))

    def test_c_data_clipper_mfu_hook_checkpoint_with_cpp_model_loss_optimizer(self):
        tables = "".join(component_table(s, t, "none") for s, t in [
            ("model", "mbx_model"), ("data.train", "mbc_data"), ("loss", "mbx_loss"),
            ("optimizer", "mbx_optimizer"), ("lr_scheduler", "mbc_scheduler"),
            ("grad_clipper", "mbc_clipper"), ("mfu", "mbc_mfu"), ("checkpoint", "mbc_checkpoint"),
            ("hooks[0]", "mbc_hook"), ("hooks[0]", "mbx_hook")])
        records, ckpts = self.train(tables + '[[hooks]]\ntype = "jsonl"\n')
        self.assertEqual([r for r in records if r["split"] == "train"][-1]["mfu"], 0.5)
        self.assertEqual(ckpts, [f"step-{STEPS}"])

    def test_c_optimizer_cpp_scheduler_mfu(self):
        tables = "".join(component_table(s, t, "none") for s, t in [
            ("model", "mbx_model"), ("loss", "mbx_loss"), ("optimizer", "mbc_optimizer"),
            ("lr_scheduler", "mbx_scheduler"), ("mfu", "mbx_mfu")])
        self.train(tables)


if __name__ == "__main__":
    print(f"test_misbehave: {len(CASES)} misbehaviour cases "
          f"({sum(c.plugin == C for c in CASES)} {C}, {sum(c.plugin == CPP for c in CASES)} {CPP})")
    sys.stdout.flush()
    unittest.main(argv=sys.argv[:1] + sys.argv[5:], verbosity=2)  # e.g. -k hook
