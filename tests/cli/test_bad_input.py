"""The bad-input catalogue: manifests, extends, --set, command-line flags, files and data that
keel must refuse cleanly. Each case runs through `keel validate` and `keel train` (flag cases:
what applies), which must agree (validate checks everything train does before step 1: the same
exit status and error line, usage errors aside), and must give

- exactly one stderr line starting with `keel: error: ` (plus, for usage errors, one `usage:`
  line), naming the place: file:line:col, the --set argument, the flag, or the path;
- exit status 1, or 2 for command-line usage; no signal, no hang;
- no backtrace ("Exception raised from"), no "terminate called", no "internal error", no raw
  C++ exception text (stol, basic_string, map::at, std::...);
- nothing left behind: the case's directory (which holds its output_dir) lists exactly what it
  held before, and the run directory does not exist afterwards (or, when it existed before,
  holds exactly what it held).

The cases run in-process: keel_inproc (tests/cli/keel_inproc.cpp, driven by tests/cli/inproc.py) calls
keel::cli_main, the function the `keel` executable runs, once per case in a few long-lived
processes, and reports any process-global state a case left changed (a leak fails the case).
The cases run as another user (as_nobody) run as keel processes, and so does a fixed sample of
the others (PROCESS_SAMPLE), whose results must equal the in-process ones. Each case runs
through every command it lists. Under the sanitizers (ASAN_OPTIONS set, as meson's 'sanitizers'
test setup does) each case runs once instead, through the last command it lists (`train` where
it lists `validate` and `train`: the same checks of the manifest, then the rest of a run's
start), in-process unless it runs as another user, without the process sample (whose point is
the runner, not memory safety); and each keel_inproc must exit 0 (LeakSanitizer reports at
exit). In a CI run this halved the keel runs under the sanitizers (the catalogue took 260 s
there).

Usage: test_bad_input.py KEEL_BINARY SOURCE_ROOT KEEL_INPROC [unittest args]
Environment: KEEL_TEST_JOBS (keel_inproc runners and parallel keel processes, default: the
number of cores), KEEL_CASES (a regular expression: run only the cases whose name it
matches)."""
import collections
import concurrent.futures
import gzip
import io
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import unittest
import zipfile
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import inproc

KEEL, ROOT, INPROC = (os.path.abspath(a) for a in sys.argv[1:4])
# What `device = "cuda"` meets: a keel built without CUDA refuses it when it reads the manifest; a
# CUDA build (-Dtorch=wheel, docs/torch.md) on a machine without a GPU when the run starts. Both
# name the place it was set.
CUDA_BUILD = "CUDA: none" not in subprocess.run([KEEL, "--version"], capture_output=True,
                                                text=True, check=True).stdout
NO_CUDA = "CUDA is not available to this process" if CUDA_BUILD else "LibTorch without CUDA"
NOBODY_KEEL = None  # keel_for_nobody()'s copy (removed at the catalogue's end)
NOBODY_KEEL_LOCK = threading.Lock()  # the catalogue's cases run on several threads


def keel_for_nobody():
    """A copy of keel that the other user (uid 65534) can run: the build tree is out of their
    reach when a parent of the checkout is private (a clone in root's home, a mode-0700
    directory). keel's own libraries are linked in (system ones are found by their system
    paths); the cases that run it fail before any plugin is searched."""
    global NOBODY_KEEL
    with NOBODY_KEEL_LOCK:
        if NOBODY_KEEL is not None:
            return NOBODY_KEEL
        stage = tempfile.mkdtemp(prefix="keel-bad-nobody-")
        os.chmod(stage, 0o755)
        NOBODY_KEEL = shutil.copy(KEEL, stage)
        os.chmod(NOBODY_KEEL, 0o755)
        return NOBODY_KEEL


NOBODY_START = None


def nobody_cannot_start(prefix, keel):
    """Why the other user cannot start the staged keel, or "" when it can: with -Dtorch=wheel,
    keel's LibTorch lies in the checkout's .venv-torch/, out of that user's reach in a private
    checkout (as CI's is), and that user cannot load it."""
    global NOBODY_START
    with NOBODY_KEEL_LOCK:
        if NOBODY_START is None:
            r = subprocess.run(prefix + [keel, "--version"], capture_output=True, text=True,
                               timeout=TIMEOUT_S)
            NOBODY_START = "" if r.returncode == 0 else (
                "uid 65534 cannot start keel here (" +
                (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1][:160] +
                "): its LibTorch lies where that user cannot read, as a private checkout's "
                ".venv-torch/ with -Dtorch=wheel")
        return NOBODY_START


QUICKSTART = os.path.join(ROOT, "configs", "quickstart.toml")
BUILD = os.path.dirname(os.path.dirname(KEEL))  # KEEL is BUILD/kernel/keel
FASHION = "/usr/share/datasets/fashion-mnist"
TIMEOUT_S = 60
FORBIDDEN = ("Exception raised from", "terminate called", "internal error", "stol",
             "basic_string", "map::at", "std::", "what():", "Aborted", "Segmentation fault",
             "core dumped", "<manifest>", ":0:0")

# The case's manifest extends small.toml: the quickstart with small data limits, one epoch and
# the run directory inside the case's directory.
SMALL = """extends = "{quickstart}"
[run]
output_dir = "{d}/run"
[train]
epochs = 1
[data.train]
limit = 256
[data.test]
limit = 100
"""

# A whole manifest without extends, for the cases that leave a table out.
TABLES = {
    "run": '[run]\nname = "t"\noutput_dir = "{d}/run"\n',
    "train": "[train]\nepochs = 1\n",
    "model": '[model]\ntype = "mlp"\nhidden = [32]\n',
    "data.train": '[data.train]\ntype = "fashion_mnist"\nlimit = 256\n',
    "data.test": '[data.test]\ntype = "fashion_mnist"\nsplit = "test"\nlimit = 100\n',
    "optimizer": '[optimizer]\ntype = "sgd"\nlr = 0.1\n',
    "loss": '[loss]\ntype = "cross_entropy"\n',
}


def standalone(without=(), extra=""):
    return "".join(t for k, t in TABLES.items() if k not in without) + extra


class Case(NamedTuple):
    name: str
    kind: str  # manifests, extends, set, flags, files, data
    text: Optional[str] = None  # case.toml (extends small.toml unless standalone)
    sets: Tuple[str, ...] = ()  # --set arguments
    where: str = ""  # the place the error line names ({m}: case.toml, {d}: the case dir)
    phrases: Tuple[str, ...] = ()  # more text the line must hold
    status: int = 1
    argv: Optional[Tuple[str, ...]] = None  # the whole command line ({cmd}, {m}, {d})
    commands: Tuple[str, ...] = ("validate", "train")
    setup: Optional[Callable[[str], None]] = None  # prepares files in the case directory
    standalone: bool = False  # text is the whole manifest
    env: Optional[Dict[str, str]] = None
    as_nobody: bool = False  # run as an unprivileged user (permission cases)
    keep_run_dir: bool = False  # the run directory exists before, holding keep.txt


def S(name, setting, where_extra=(), **kw):
    """A --set case: the line must name the --set argument."""
    return Case(name, "set", sets=(setting,), where=f"--set {setting}", phrases=where_extra, **kw)


def M(name, text, where, *phrases, **kw):
    return Case(name, "manifests", text=text, where=where, phrases=phrases, **kw)


def E(name, text, where, *phrases, **kw):
    return Case(name, "extends", text=text, where=where, phrases=phrases, **kw)


def F(name, argv, where, *phrases, status=2, commands=("validate", "train"), **kw):
    return Case(name, "flags", argv=argv, where=where, phrases=phrases, status=status,
                commands=commands, **kw)


def X(name, argv, where, *phrases, **kw):
    return Case(name, "files", argv=argv, where=where, phrases=phrases, **kw)


def D(name, sets, where, *phrases, **kw):
    return Case(name, "data", sets=sets, where=where, phrases=phrases, **kw)


# Setup helpers (run in the case directory).
def copy_fixture(name, subdir):
    def f(d):
        os.makedirs(os.path.join(d, subdir), exist_ok=True)
        shutil.copy(os.path.join(BUILD, "tests", "fixtures", name), os.path.join(d, subdir, name))
    return f


def mkfifo(name):
    return lambda d: os.mkfifo(os.path.join(d, name))


def mkdir(name):
    return lambda d: os.makedirs(os.path.join(d, name))


def write(name, text):
    def f(d):
        p = os.path.join(d, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as fh:
            fh.write(text.replace("{d}", d))
    return f


def sparse(name, size):
    def f(d):
        with open(os.path.join(d, name), "wb") as fh:
            fh.truncate(size)
    return f


def symlink_loop(name):
    return lambda d: os.symlink(name, os.path.join(d, name))


def unreadable(name, text):
    def f(d):
        write(name, text)(d)
        os.chmod(os.path.join(d, name), 0)
        os.chmod(d, 0o755)  # the unprivileged user may enter the case directory
    return f


def fashion_copy(name, damage):
    """A copy of the Fashion-MNIST directory in `name` whose train images file is damaged."""
    def f(d):
        dst = os.path.join(d, name)
        os.makedirs(dst)
        for fn in os.listdir(FASHION):
            if fn != "train-images-idx3-ubyte.gz":
                os.symlink(os.path.join(FASHION, fn), os.path.join(dst, fn))
        damage(os.path.join(dst, "train-images-idx3-ubyte.gz"))
    return f


def truncated_gzip(path):
    with gzip.open(os.path.join(FASHION, "train-images-idx3-ubyte.gz"), "rb") as src:
        head = src.read(16 + 28 * 28 * 10)  # the header promises 60000 images: 10 follow
    with gzip.open(path, "wb") as dst:
        dst.write(head)


def not_gzip(path):
    with open(path, "wb") as fh:
        fh.write(b"this is not gzip data, just text\n" * 4)


def both(*fs):
    def f(d):
        for g in fs:
            g(d)
    return f


def crafted_pt(stride, numel=256 * 784):
    """A .pt file as torch.save writes one, {"fc1.weight": a [256, 784] float tensor (the
    quickstart model's first layer)}, whose first stride is `stride` over a storage of `numel`
    floats (by default exactly 256 * 784)."""
    def string(v):
        return b"X" + len(v).to_bytes(4, "little") + v
    def long(v):
        return b"\x8a\x08" + v.to_bytes(8, "little", signed=True)
    pkl = (b"\x80\x02}(" + string(b"fc1.weight") + b"ctorch._utils\n_rebuild_tensor_v2\n((" +
           string(b"storage") + b"ctorch\nFloatStorage\n" + string(b"0") + string(b"cpu") +
           long(numel) + b"tQ" + long(0) + b"(" + long(256) + long(784) + b"t(" + long(stride) +
           long(1) + b"t\x89ccollections\nOrderedDict\n)RtRu.")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/data/0", b"\0" * (numel * 4))
        z.writestr("archive/version", b"3\n")
    return out.getvalue()


def write_bytes(name, data):
    def f(d):
        os.makedirs(os.path.dirname(os.path.join(d, name)), exist_ok=True)
        with open(os.path.join(d, name), "wb") as fh:
            fh.write(data)
    return f


def token_files(d):
    """vocab.json (10 ids, uint16) and token files for the tokens dataset: ok.bin (100 tokens),
    odd.bin (41 bytes)."""
    with open(os.path.join(d, "vocab.json"), "w") as f:
        f.write('{"format": "keel-tokens", "version": 1, "level": "char", "dtype": "uint16", '
                '"size": 10, "tokens": 100, "vocab": ["0","1","2","3","4","5","6","7","8","9"]}')
    with open(os.path.join(d, "ok.bin"), "wb") as f:
        f.write(bytes([3, 0]) * 100)
    with open(os.path.join(d, "odd.bin"), "wb") as f:
        f.write(b"\0" * 41)


def tokens_manifest(path, context=8):
    """A whole manifest whose [data.train] is the tokens dataset reading `path`."""
    return standalone(["data.train", "data.test"], extra=(
        f'[data.train]\ntype = "tokens"\npath = "{path}"\ncontext = {context}\nbatch_size = 2\n'))


Q = "{m}"
CMD = "{cmd}"

# A commit record listing no file, whose model tensor 'w' is held by object OBJECT.
HANDED_RECORD = ('{"format": "keel-checkpoint", "version": 2, "run_id": "r", "step": 1, '
                 '"committed_unix_ns": 1, "files": [], "tensors": {}, "chunks": {"model": '
                 '{"w": {"dtype": "F32", "shape": [2], "chunks": [{"offset": [0], "size": [2], '
                 '"object": "OBJECT"}]}}}, "metrics": {}}')

CASES = [
    # manifests: TOML syntax -------------------------------------------------------------------
    M("toml_missing_value", "[run]\nname = \n", "{m}:2:", "invalid TOML"),
    M("toml_unclosed_string", '[run]\nname = "abc\n', "{m}:2:", "invalid TOML"),
    M("toml_duplicate_table", "[train]\nepochs = 1\n[train]\nlog_every = 1\n", "{m}:3:",
      "invalid TOML", "once"),
    M("toml_duplicate_key", "[train]\nepochs = 1\nepochs = 2\n", "{m}:3:", "invalid TOML"),
    M("toml_unclosed_array", "[model]\nhidden = [1, 2\n", "{m}:", "invalid TOML"),
    M("toml_bare_string", "[run]\nname = quick\n", "{m}:2:", "invalid TOML", "quoted"),
    M("toml_binary_garbage", "[run]\nname = \"\x01\x02\"\n", "{m}:2:", "invalid TOML"),
    # bytes from the input that would drive a terminal are shown as \xNN (escape: clear screen)
    M("unknown_type_terminal_escape", '[model]\ntype = "mlp\\u001b[2J\\u009b"\n', "{m}:2:",
      "'mlp\\x1b[2J\\xc2\\x9b'"),
    M("toml_unclosed_header", "[optimizer\nlr = 1\n", "{m}:1:", "invalid TOML"),
    # manifests: unknown sections and keys
    M("unknown_section", "[optimiser]\nlr = 1.0\n", "{m}:", "unknown section 'optimiser'",
      "did you mean 'optimizer'"),
    M("unknown_top_level_key", "epochs = 3\n", "{m}:1:1", "unknown section 'epochs'"),
    M("unknown_data_table", '[data.tset]\ntype = "fashion_mnist"\n', "{m}:", "[data.tset]",
      "did you mean 'test'"),
    M("unknown_key_optimizer", "[optimizer]\nlrr = 1\n", "{m}:2:1", "unknown key 'lrr'",
      "did you mean 'lr'"),
    # "did you mean": case aside (adamW is adamw, not adam), initials (learning_rate is lr)
    M("unknown_key_learning_rate", "[optimizer]\nlearning_rate = 1e-3\n", "{m}:2:1",
      "unknown key 'learning_rate'", "did you mean 'lr'"),
    M("unknown_key_weight_decay_initials", "[optimizer]\nwd = 0.1\n", "{m}:2:1",
      "unknown key 'wd'", "did you mean 'weight_decay'"),
    M("unknown_key_run", "[run]\nseeed = 1\n", "{m}:2:1", "unknown key 'seeed'",
      "did you mean 'seed'", "keel options run"),
    M("unknown_key_train", "[train]\nepoch = 3\n", "{m}:2:1", "unknown key 'epoch'",
      "did you mean 'epochs'", "keel options train"),
    M("unknown_key_checkpoint", "[checkpoint]\nevery_step = 5\n", "{m}:2:1",
      "unknown key 'every_step'", "every_steps"),
    M("unknown_key_hook", '[[hooks]]\ntype = "console"\nevry = 2\n', "{m}:3:1",
      "unknown key 'evry'", "hooks[0]"),
    M("unknown_key_plugins", '[plugins]\npath = ["x"]\n', "{m}:2:1", "unknown key 'path'",
      "paths"),
    M("unknown_key_dataset", "[data.train]\nlimt = 5\n", "{m}:2:1", "unknown key 'limt'",
      "did you mean 'limit'", "keel plugins show fashion_mnist"),
    # [distributed], [run] device and launcher variables (data parallelism)
    M("unknown_key_distributed", "[distributed]\ntimeout = 5\n", "{m}:2:1",
      "unknown key 'timeout'", "did you mean 'timeout_s'", "keel options distributed"),
    M("distributed_timeout_zero", "[distributed]\ntimeout_s = 0\n", "{m}:2:",
      "distributed.timeout_s"),
    M("distributed_backend_unknown", '[distributed]\nbackend = "mpi"\n', "{m}:2:",
      "distributed.backend", "gloo"),
    M("device_unknown", '[run]\ndevice = "gpu"\n', "{m}:2:10", "run.device = \"gpu\" is not a "
      "device", "cuda:N"),
    M("device_cuda_cpu_build", '[run]\ndevice = "cuda:1"\n', "{m}:2:10",
      NO_CUDA, "device = \"cpu\" or \"auto\""),
    S("set_device_cuda", "run.device=cuda", (NO_CUDA,)),
    M("launcher_rank_not_a_number", "", "RANK='x' (set by torchrun)", "expected an integer",
      commands=("train",), env={"RANK": "x", "WORLD_SIZE": "2"}),
    M("launcher_rank_out_of_range", "", "RANK='2' (set by torchrun)", "from 0 to 1",
      commands=("train",), env={"RANK": "2", "WORLD_SIZE": "2"}),
    M("launcher_no_master", "", "MASTER_ADDR is not set, but torchrun variables are",
      "MASTER_PORT", commands=("train",), env={"RANK": "0", "WORLD_SIZE": "2"}),
    M("launcher_bad_port", "", "MASTER_PORT='99999' (set by Slurm)", "from 1 to 65535",
      commands=("train",), env={"SLURM_PROCID": "0", "SLURM_NTASKS": "2",
                                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"}),
    # manifests: wrong types
    M("type_epochs_string", '[train]\nepochs = "two"\n', "{m}:2:10", "train.epochs",
      "expected integer"),
    M("type_hidden_integer", "[model]\nhidden = 32\n", "{m}:2:10", "model.hidden",
      "expected list of integers"),
    M("type_hidden_element", '[model]\nhidden = [256, "x"]\n', "{m}:2:", "model.hidden",
      "element"),
    M("type_lr_bool", "[optimizer]\nlr = true\n", "{m}:2:6", "optimizer.lr", "expected float"),
    M("type_shuffle_string", '[data.test]\nshuffle = "no"\n', "{m}:2:11", "data.test.shuffle",
      "expected bool"),
    M("type_section_is_value", "train = 5\n", "{m}:1:", "[train] must be a table"),
    M("type_name_integer", "[run]\nname = 7\n", "{m}:2:8", "run.name", "expected string"),
    M("type_priority_string", '[[hooks]]\ntype = "console"\npriority = "high"\n', "{m}:3:",
      "hooks[0].priority"),
    # manifests: out-of-range values
    M("range_lr_negative", "[optimizer]\nlr = -1.0\n", "{m}:2:6", "optimizer.lr", "must be"),
    M("range_batch_size_zero", "[data.train]\nbatch_size = 0\n", "{m}:2:", "data.train.batch_size",
      "must be"),
    M("range_threads", "[run]\nthreads = 100000\n", "{m}:2:", "run.threads", "must be"),
    M("range_seed_negative", "[run]\nseed = -1\n", "{m}:2:", "run.seed", "must be"),
    M("range_lr_nan", "[optimizer]\nlr = nan\n", "{m}:2:", "optimizer.lr", "finite"),
    M("range_max_norm_inf", "[grad_clipper]\nmax_norm = inf\n", "{m}:2:", "grad_clipper.max_norm"),
    # a schema's exclusive bounds, enforced at validation: betas in [0, 1), max_norm > 0
    M("range_beta1_one", "[optimizer]\nbeta1 = 1.0\n", "{m}:2:9", "optimizer.beta1",
      "must be in [0, 1), got 1"),
    M("range_beta2_one_adam", '[optimizer]\ntype = "adam"\nbeta2 = 1\n', "{m}:3:9",
      "optimizer.beta2", "must be in [0, 1), got 1"),
    M("range_sparse_beta1_one", '[sparse_optimizer]\ntype = "adamw"\nbeta1 = 1.0\n', "{m}:3:9",
      "sparse_optimizer.beta1", "must be in [0, 1), got 1"),
    M("range_max_norm_zero", "[grad_clipper]\nmax_norm = 0.0\n", "{m}:2:12",
      "grad_clipper.max_norm", "must be > 0, got 0"),
    M("range_warmup_negative", "[lr_scheduler]\nwarmup_steps = -5\n", "{m}:2:",
      "lr_scheduler.warmup_steps", "must be"),
    M("range_class_dim_too_large", "[loss]\nclass_dim = 64\n", "{m}:2:", "loss.class_dim",
      "must be in [-64, 63]", "got 64"),
    M("range_class_dim_too_negative", "[loss]\nclass_dim = -65\n", "{m}:2:", "loss.class_dim",
      "must be in [-64, 63]", "got -65"),
    M("choice_split", '[data.test]\nsplit = "tset"\n', "{m}:2:", "data.test.split",
      'did you mean "test"'),
    M("choice_mode", '[run]\nmode = "training"\n', "{m}:2:", "run.mode", "train_and_evaluate"),
    M("choice_precision", '[train]\nprecision = "fp8"\n', "{m}:2:", "train.precision"),
    M("fp16_needs_cuda", '[train]\nprecision = "fp16"\n', "{m}:", "fp16", "bf16"),
    M("no_stop_target", "[train]\nepochs = 0\n", "{m}:", "no stop target"),
    # manifests: unknown type names
    M("unknown_optimizer", '[optimizer]\ntype = "nadam"\n', "{m}:2:8", "no optimizer named 'nadam'",
      "available: "),
    M("unknown_optimizer_case", '[optimizer]\ntype = "adamW"\n', "{m}:2:8",
      "no optimizer named 'adamW'", "did you mean 'adamw'"),
    M("unknown_model", '[model]\ntype = "mpl"\n', "{m}:2:8", "no model named 'mpl'",
      "did you mean 'mlp'"),
    M("unknown_hook", '[[hooks]]\ntype = "consol"\n', "{m}:2:8", "no hook named 'consol'",
      "did you mean 'console'"),
    M("unknown_dataset", '[data.train]\ntype = "mnist"\n', "{m}:2:8", "no dataset named 'mnist'"),
    M("type_not_a_string", "[loss]\ntype = 3\n", "{m}:2:8", "[loss] needs type"),
    M("type_missing", "[mfu]\npeak_tflops = 1.0\n", "{m}:", "[mfu] needs type"),
    M("required_option_missing", '[mfu]\ntype = "peak_flops"\n', "{m}:", "[mfu] needs 'peak_tflops'"),
    # manifests: missing required tables
    M("missing_loss", standalone(["loss"]), "{m}", "no [loss] table", standalone=True),
    M("missing_model", standalone(["model"]), "{m}", "no [model] table", standalone=True),
    M("missing_data_train", standalone(["data.train"]), "{m}", "no [data.train] table",
      standalone=True),
    M("missing_optimizer", standalone(["optimizer"]), "{m}", "no [optimizer] table",
      standalone=True),
    M("evaluate_without_test_data", standalone(["data.test"]).replace(
        '[run]\n', '[run]\nmode = "evaluate"\n'), "{m}", "[data.test]", standalone=True),
    M("empty_manifest", "", "{m}", "no [model] table", standalone=True),
    # manifests: bad hooks arrays
    M("hooks_integer", "hooks = 1\n", "{m}:1:", "hooks must be an array of tables"),
    M("hooks_strings", 'hooks = ["console"]\n', "{m}:1:", "hooks must be an array of tables"),
    M("hooks_table", '[hooks]\ntype = "console"\n', "{m}:", "hooks must be an array of tables"),
    M("hooks_mixed", 'hooks = [{type = "console"}, 1]\n', "{m}:1:",
      "hooks must be an array of tables"),
    # manifests: bad [[optimizer.groups]]
    M("groups_bad_regex", '[[optimizer.groups]]\nparams = "fc1[("\n', "{m}:2:",
      "optimizer.groups[0].params", "regular expression"),
    M("groups_missing_params", "[[optimizer.groups]]\nlr = 0.1\n", "{m}:",
      "needs 'params'"),
    M("groups_negative_lr", '[[optimizer.groups]]\nparams = ".*"\nlr = -1.0\n', "{m}:3:",
      "optimizer.groups[0].lr"),
    M("groups_not_tables", "[optimizer]\ngroups = [1, 2]\n", "{m}:2:",
      "optimizer.groups must be an array of tables"),
    M("groups_unknown_key", '[[optimizer.groups]]\nparams = ".*"\nlrr = 1.0\n', "{m}:3:1",
      "unknown key 'lrr'", "keel options optimizer.groups"),
    M("groups_match_nothing", '[[optimizer.groups]]\nparams = "nothing"\n', "optimizer.groups[0]",
      "matches no parameter"),
    M("plugins_paths_string", '[plugins]\npaths = "x"\n', "{m}:2:", "plugins.paths"),
    M("plugins_paths_integers", "[plugins]\npaths = [1]\n", "{m}:2:", "plugins.paths"),
    M("plugins_paths_missing", '[plugins]\npaths = ["nope"]\n', "{m}:2:", "plugins.paths",
      "{d}/nope does not exist"),
    M("plugins_paths_file", '[plugins]\npaths = ["afile"]\n', "{m}:2:", "plugins.paths",
      "{d}/afile is not a directory", setup=write("afile", "x")),
    M("plugins_require_not_table", '[plugins]\nrequire = ">=1"\n', "{m}:2:", "plugins.require",
      "expected a table"),
    M("plugins_require_bad_syntax", '[plugins]\nrequire = { "keel-losses" = ">=1.x" }\n',
      "{m}:2:", "plugins.require.keel-losses", "'>=1.x'"),
    M("plugins_require_unmet", '[plugins]\nrequire = { "keel-losses" = ">=9" }\n', "{m}:2:",
      "found keel-losses 0.3.0", "does not satisfy it"),
    M("plugins_require_missing", '[plugins]\nrequire = { "acme-losses" = "*" }\n', "{m}:2:",
      "no plugin named 'acme-losses' was found", "keel plugins install"),
    M("component_in_two_plugins",
      '[plugins]\npaths = ["p"]\n[lr_scheduler]\ntype = "constant"\n', "{m}:4:",
      "2 plugins provide lr_scheduler 'constant'", "{d}/p/duplicate_component.so",
      'type = "test-duplicate-component:constant"',
      setup=copy_fixture("duplicate_component.so", "p")),
    M("refused_plugin_named", '[plugins]\npaths = ["p"]\n[[hooks]]\ntype = "wrong_abi_hook"\n',
      "{m}:4:", "no hook named 'wrong_abi_hook'",
      "1 plugin file was refused: {d}/p/wrong_abi.so (built for plugin ABI 2.0, this keel speaks",
      setup=copy_fixture("wrong_abi.so", "p")),
    M("lock_hash_differs", "", "{m}.lock", "plugin keel-losses 0.1.0 (sha256 0000000000000000...) "
      "is locked but was not loaded", "differs from", "keel plugins lock",
      setup=write("case.toml.lock", '[[plugin]]\nname = "keel-losses"\nversion = "0.1.0"\n'
                  'path = "' + os.path.join(BUILD, "plugins", "losses", "libkeel-losses.so") +
                  '"\nsha256 = "' + "0" * 64 + '"\n')),
    M("lock_malformed", "", "{m}.lock:1:", "not a valid lock file",
      setup=write("case.toml.lock", "[[plugin]\n")),
    # extends ----------------------------------------------------------------------------------
    E("extends_missing", 'extends = "nope.toml"\n', "{m}:1:1", "{d}/nope.toml", "not found",
      standalone=True),
    E("extends_directory", 'extends = "sub"\n', "{m}:1:1", "{d}/sub", "is a directory",
      standalone=True, setup=mkdir("sub")),
    E("extends_fifo", 'extends = "pipe.toml"\n', "{m}:1:1", "{d}/pipe.toml", "FIFO",
      standalone=True, setup=mkfifo("pipe.toml")),
    E("extends_device", 'extends = "/dev/null"\n', "{m}:1:1", "/dev/null", "character device",
      standalone=True),
    E("extends_not_string", "extends = 3\n", "{m}:1:11", "must be a string", standalone=True),
    E("extends_array", 'extends = ["small.toml"]\n', "{m}:1:11", "must be a string",
      standalone=True),
    E("extends_empty", 'extends = ""\n', "{m}:1:11", "empty", standalone=True),
    E("extends_itself", 'extends = "case.toml"\n', "{m}:1:1", "cycle", standalone=True),
    E("extends_cycle", 'extends = "a.toml"\n', "{d}/a.toml:2:1", "cycle",
      standalone=True, setup=write("a.toml", '# a\nextends = "case.toml"\n')),
    E("extends_base_invalid_toml", 'extends = "bad.toml"\n', "{d}/bad.toml:2:", "invalid TOML",
      standalone=True, setup=write("bad.toml", "[run]\nname = \n")),
    E("extends_base_unknown_key", 'extends = "base.toml"\n', "{d}/base.toml:3:1",
      "unknown key 'sed'", standalone=True,
      setup=write("base.toml", 'extends = "small.toml"\n[run]\nsed = 1\n')),
    E("extends_inside_table", '[run]\nextends = "small.toml"\n', "{m}:2:1",
      "unknown key 'extends' in [run]"),
    E("extends_unreadable", 'extends = "secret.toml"\n', "{m}:1:1", "{d}/secret.toml",
      "Permission denied", standalone=True, as_nobody=True,
      setup=unreadable("secret.toml", "[run]\n")),
    E("extends_parent_is_file", 'extends = "small.toml/x.toml"\n', "{m}:1:1", "not found",
      standalone=True),
    # --set ------------------------------------------------------------------------------------
    S("set_index_not_a_number", "hooks[x].path=a", ("not an index", "hooks[0] (type console)")),
    S("set_index_negative", "hooks[-1].path=a", ("negative", "hooks[1]")),
    S("set_index_out_of_range", "hooks[7].path=a", ("out of range", "2 entries")),
    S("set_index_overflow", "hooks[99999999999999999999999].path=a", ("out of range",)),
    S("set_index_empty", "hooks[].path=a", ("empty index",)),
    S("set_bracket_unclosed", "hooks[1.path=a", ("without a closing ']'",)),
    S("set_bracket_unopened", "hooks]=1", ("without an opening '['",)),
    S("set_index_on_table", "run[0].name=x", ("not an array", "run.name")),
    S("set_index_on_value", "optimizer.lr[0]=1", ("not an array",)),
    S("set_through_value", "optimizer.lr.x=1", ("is a value (0.001)", "--set optimizer.lr=")),
    S("set_through_array", "hooks.type=csv", ("is an array", "hooks[0].type")),
    S("set_empty_key", "=3", ("key before '=' is empty",)),
    S("set_no_equals", "optimizer", ("expected KEY=VALUE",)),
    S("set_empty_value", "optimizer.lr=", ("value after '=' is empty", "'optimizer.lr=\"\"'")),
    S("set_double_dot", "a..b=1", ("empty name",)),
    S("set_leading_dot", ".a=1", ("empty name",)),
    S("set_trailing_dot", "a.=1", ("ends with '.'",)),
    S("set_space_in_key", "op timizer.lr=1", ("cannot appear in a key",)),
    S("set_nested_index", "hooks[0][1].x=1", ("one index",)),
    S("set_whole_array_entry", "hooks[0]=x", ("whole entry", "hooks[0].type")),
    S("set_table_to_value", "optimizer=adamw", ("is a table", "optimizer.type")),
    S("set_tables_to_value", "hooks=3", ("array of tables", "hooks=[]")),
    S("set_invalid_toml_array", "model.hidden=[1,2", ("not valid TOML", "quote")),
    S("set_unclosed_quote", 'run.name="abc', ("not valid TOML",)),
    S("set_missing_array", "optimizer.groups[0].params=x", ("not in the manifest",)),
    S("set_value_index_out_of_range", "model.hidden[5]=1", ("out of range", "model.hidden[1] = 128")),
    S("set_extends", "extends=x", ("cannot be set",)),
    S("set_unknown_section", "optimiser.lr=1", ("unknown section 'optimiser'", "optimizer")),
    S("set_unknown_key", "data.train.nope=1", ("unknown key 'nope' in [data.train]",)),
    S("set_wrong_type", "optimizer.lr=fast", ("optimizer.lr", "expected float")),
    S("set_out_of_range", "train.epochs=-3", ("train.epochs", "must be in")),
    S("set_new_section_needs_option", "mfu.type=peak_flops", ("[mfu] needs 'peak_tflops'",)),
    S("set_unknown_type", "optimizer.type=nadam", ("no optimizer named 'nadam'",)),
    S("set_hook_unknown_type", "hooks[1].type=jsnol", ("no hook named 'jsnol'", "jsonl")),
    # command-line flags -------------------------------------------------------------------------
    F("unknown_command", ("trian", Q), "'trian'", "unknown command", "did you mean 'train'",
      commands=("-",)),
    F("unknown_flag", (CMD, Q, "--sett", "x=1"), "--sett", "did you mean '--set'"),
    F("unknown_global_flag", ("--verison",), "--verison", "did you mean '--version'",
      commands=("-",)),
    F("set_without_value", (CMD, Q, "--set"), "--set", "needs a value"),
    F("set_before_command", ("--set", "run.seed=1", CMD, Q), "--set", "after the command"),
    F("manifest_argument_missing", (CMD,), "needs a MANIFEST"),
    F("manifest_argument_empty", (CMD, ""), "MANIFEST is an empty string"),
    F("two_manifests", (CMD, Q, Q), "{m}", "unexpected argument"),
    F("log_level_bad", (CMD, Q, "--log-level", "loud"), "--log-level loud",
      "trace, debug, info, warn, error, off"),
    F("log_level_typo", (CMD, Q, "--log-level=debgu"), "--log-level debgu", "did you mean 'debug'"),
    F("log_level_missing_value", (CMD, Q, "--log-level"), "--log-level", "needs a value"),
    F("flag_missing_value_named", ("prepare", "in.txt", "--output"), "--output: needs a value",
      "hint: --output DIR", commands=("-",)),
    F("log_level_twice", (CMD, Q, "--log-level", "info", "--log-level", "warn"), "--log-level",
      "more than once"),
    F("log_level_env_bad", (CMD, Q), "KEEL_LOG_LEVEL=loud", "trace, debug",
      env={"KEEL_LOG_LEVEL": "loud"}),
    F("help_with_value", (CMD, Q, "--help=yes"), "--help", "takes no value"),
    F("no_command", (), "no command given", commands=("-",)),
    F("help_unknown_command", ("help", "trian"), "'trian'", "did you mean 'train'",
      commands=("-",)),
    F("plugins_show_without_name", ("plugins", "show"), "keel plugins show", "needs a NAME",
      commands=("-",)),
    F("plugins_bad_argument", ("plugins", "shwo"), "shwo", "did you mean 'show'",
      commands=("-",)),
    F("plugins_with_set", ("plugins", "--set", "a=1"), "--set", "train, evaluate and validate",
      commands=("-",)),
    F("plugins_flag_of_another_subcommand", ("plugins", "--kind", "loss"), "--kind",
      "does not take it", commands=("-",)),
    F("plugins_lock_without_manifest", ("plugins", "lock"), "keel plugins lock", "needs a MANIFEST",
      commands=("-",)),
    F("plugins_show_unknown", ("plugins", "show", "adamww"), "adamww", "did you mean 'adamw'",
      status=1, commands=("-",)),
    F("plugins_show_kernel_table", ("plugins", "show", "train"), "train", "keel options train",
      status=1, commands=("-",)),
    F("options_unknown_table", ("options", "trian"), "trian", "did you mean 'train'",
      status=1, commands=("-",)),
    F("options_component_table", ("options", "optimizer"), "optimizer", "keel plugins show",
      status=1, commands=("-",)),
    F("options_eval_set_table", ("options", "data.eval.valid"), "[data.eval.valid]",
      "keel plugins show", "datasets found", status=1, commands=("-",)),
    F("plugins_show_eval_set_table", ("plugins", "show", "data.eval.valid"),
      "[data.eval.valid] names its dataset", "datasets found", status=1, commands=("-",)),
    F("options_two_tables", ("options", "run", "train"), "train", "unexpected argument",
      commands=("-",)),
    F("prepare_bad_level", ("prepare", "{d}/in.txt", "--output", "{d}/out", "--level", "word"),
      "--level word", "--level char", "--level byte", commands=("-",),
      setup=write("in.txt", "abc\n")),
    F("prepare_documents_bad_escape", ("prepare", "{d}/in.txt", "--output", "{d}/out",
                                       "--documents", "a\\qb"), "--documents",
      "a backslash at offset 1", commands=("-",), setup=write("in.txt", "abc\n")),
    F("prepare_documents_empty", ("prepare", "{d}/in.txt", "--output", "{d}/out",
                                  "--documents", ""), "--documents", "the separator is empty",
      commands=("-",), setup=write("in.txt", "abc\n")),
    F("prepare_without_output", ("prepare", "{d}/in.txt"), "keel prepare", "needs --output DIR",
      commands=("-",), setup=write("in.txt", "abc\n")),
    F("prepare_without_input", ("prepare", "--output", "{d}/out"), "keel prepare",
      "needs an INPUT", commands=("-",)),
    F("report_without_run_dir", ("report",), "keel report", "needs RUN_DIR", commands=("-",)),
    F("report_two_run_dirs", ("report", "{d}/a", "{d}/b"), "keel report", "takes one RUN_DIR",
      commands=("-",)),
    # files --------------------------------------------------------------------------------------
    X("manifest_missing", (CMD, "{d}/nope.toml"), "{d}/nope.toml", "not found"),
    X("manifest_directory", (CMD, "{d}/sub"), "{d}/sub", "is a directory", setup=mkdir("sub")),
    X("manifest_fifo", (CMD, "{d}/pipe.toml"), "{d}/pipe.toml", "FIFO", setup=mkfifo("pipe.toml")),
    X("manifest_dev_null", (CMD, "/dev/null"), "/dev/null", "character device"),
    X("manifest_dev_zero", (CMD, "/dev/zero"), "/dev/zero", "character device"),
    X("manifest_parent_is_file", (CMD, "{d}/small.toml/x.toml"), "{d}/small.toml/x.toml",
      "not found"),
    X("manifest_symlink_loop", (CMD, "{d}/loop.toml"), "{d}/loop.toml", "cannot be read",
      setup=symlink_loop("loop.toml")),
    X("manifest_too_large", (CMD, "{d}/big.toml"), "{d}/big.toml", "too large",
      setup=sparse("big.toml", 64 << 20)),
    X("manifest_unreadable", (CMD, "{d}/secret.toml"), "{d}/secret.toml", "Permission denied",
      as_nobody=True, setup=unreadable("secret.toml", "[run]\n")),
    X("output_dir_is_a_file", (CMD, Q, "--set", "run.output_dir={d}/file"), "{d}/file",
      setup=write("file", "not a directory\n")),
    X("output_dir_under_a_file", (CMD, Q, "--set", "run.output_dir={d}/file/run"),
      "{d}/file/run", setup=write("file", "not a directory\n")),
    X("init_from_missing", (CMD, Q, "--set", "checkpoint.init_from={d}/nope"), "{d}/nope"),
    X("init_from_not_a_checkpoint", (CMD, Q, "--set", "checkpoint.init_from={d}/ckpt"),
      "{d}/ckpt", setup=mkdir("ckpt")),
    # Without a commit record only the safetensors backend loads a directory unasked; the
    # torch backend checks every tensor against its storage (LibTorch's unpickler, which keel
    # used before, took a stride of 2^40 or of 800 unchecked: a crash, or heap memory read).
    X("init_from_uncommitted_torch", (CMD, Q, "--set", "checkpoint.type=torch", "--set",
                                      "checkpoint.init_from={d}/ckpt"),
      "{d}/ckpt", "has no commit record", "init_from_unverified = true",
      setup=write_bytes("ckpt/model.pt", crafted_pt(784))),
    X("init_from_pt_huge_stride", (CMD, Q, "--set", "checkpoint.type=torch", "--set",
                                   "checkpoint.init_from={d}/ckpt", "--set",
                                   "checkpoint.init_from_unverified=true"),
      "{d}/ckpt/model.pt", "strides [1099511627776, 1]", "past the storage's end",
      setup=write_bytes("ckpt/model.pt", crafted_pt(1 << 40))),
    X("init_from_pt_stride_800", (CMD, Q, "--set", "checkpoint.type=torch", "--set",
                                  "checkpoint.init_from={d}/ckpt", "--set",
                                  "checkpoint.init_from_unverified=true"),
      "{d}/ckpt/model.pt", "strides [800, 1]", "past the storage's end",
      setup=write_bytes("ckpt/model.pt", crafted_pt(800))),
    # issue 43, finding 8: a stride-0 view claims more elements than its storage holds (the
    # model's [256, 784] over 784 floats: a 3 KB file standing for 800 KB, or for 2 GB)
    X("init_from_pt_stride_0", (CMD, Q, "--set", "checkpoint.type=torch", "--set",
                                "checkpoint.init_from={d}/ckpt", "--set",
                                "checkpoint.init_from_unverified=true"),
      "{d}/ckpt/model.pt", "strides [0, 1]", "its 200704 elements are more than its storage holds",
      setup=write_bytes("ckpt/model.pt", crafted_pt(0, numel=784))),
    X("init_from_damaged_commit_record", (CMD, Q, "--set", "checkpoint.init_from={d}/ckpt"),
      "{d}/ckpt/commit.json", "invalid commit record", setup=write("ckpt/commit.json", "{x")),
    # issue 43, findings 2 and 9: a handed commit record (without commit.json.xxh3, as one of an
    # earlier keel: accepted with a warning, then checked) naming an object outside the
    # checkpoint, or claiming a shape whose bytes overflow 64 bits (exit 70 once)
    X("init_from_commit_record_object_outside", (CMD, Q, "--set", "checkpoint.init_from={d}/ckpt"),
      "{d}/ckpt/commit.json", "names object '../outside/evil' is not a plain name",
      setup=write("ckpt/commit.json", HANDED_RECORD.replace("OBJECT", "../outside/evil"))),
    X("resume_commit_record_object_outside", (CMD, Q, "--resume={d}/ckpt"), "{d}/ckpt/commit.json",
      "names object '../outside/evil' is not a plain name",
      setup=write("ckpt/commit.json", HANDED_RECORD.replace("OBJECT", "../outside/evil"))),
    X("resume_commit_record_claims_2_62_rows", (CMD, Q, "--resume={d}/ckpt"), "{d}/ckpt/commit.json",
      "tensor 'w.exp_avg' of object 'optimizer' claims shape [4611686018427387904, 4] of F32, "
      "more bytes than 64 bits count",
      setup=write("ckpt/commit.json", HANDED_RECORD.replace("OBJECT", "model").replace(
          '"tensors": {}', '"tensors": {"optimizer": [{"name": "w.exp_avg", "dtype": "F32", '
          '"shape": [4611686018427387904, 4]}]}'))),
    # resume: validate takes train's flags and refuses what train would ---------------------------
    X("resume_path_missing", (CMD, Q, "--resume", "{d}/nope"), "--resume {d}/nope",
      "not a directory"),
    X("resume_path_not_a_checkpoint", (CMD, Q, "--resume", "{d}/ckpt"), "{d}/ckpt/commit.json",
      "missing", setup=mkdir("ckpt")),
    X("resume_damaged_commit_record", (CMD, Q, "--resume={d}/ckpt"), "{d}/ckpt/commit.json",
      "invalid commit record", setup=write("ckpt/commit.json", "[1, 2]")),
    Case("resume_without_checkpoint_table", "files", text=standalone(), standalone=True,
         argv=(CMD, Q, "--resume"), where="--resume", phrases=("no [checkpoint] table",)),
    F("resume_changed_without_resume", (CMD, Q, "--resume-changed"), "--resume-changed",
      "only applies with --resume"),
    # run directories: what a training run's start refuses, validate refuses with the same line
    # (issue 42: validate said ok on a directory train then refused) ---------------------------
    X("run_dir_earlier_records", (CMD, Q), "run directory {d}/run holds an earlier run's records",
      "(metrics.jsonl, 1 checkpoint in checkpoints/)", "--resume", "--overwrite",
      setup=lambda d: (write("run/metrics.jsonl", "{}\n")(d), mkdir("run/checkpoints/step-4")(d)),
      keep_run_dir=True),
    X("run_dir_checkpoints_symlink", (CMD, Q), "{d}/run/checkpoints: cannot open it as a directory",
      "keel does not follow symlinks", setup=lambda d: (
          mkdir("elsewhere")(d), mkdir("run")(d),
          os.symlink("../elsewhere", f"{d}/run/checkpoints")), keep_run_dir=True),
    # The earlier run's records stay as they were: the jsonl sink, created before run.log is
    # refused, starts its file afresh only at its first record (it truncated it to 0 bytes).
    X("overwrite_run_log_symlink", (CMD, Q, "--overwrite"), "{d}/run/run.log is a symbolic link",
      setup=lambda d: (write("run/metrics.jsonl", '{"split": "train", "step": 1}\n')(d),
                       os.symlink(f"{d}/elsewhere.log", f"{d}/run/run.log")),
      keep_run_dir=True),
    X("overwrite_run_log_fifo", (CMD, Q, "--overwrite"), "{d}/run/run.log", "cannot write it",
      setup=lambda d: (mkdir("run")(d), os.mkfifo(f"{d}/run/run.log")), keep_run_dir=True),
    X("resume_plugins_json_directory", (CMD, Q, "--resume"), "cannot write {d}/run/plugins.json",
      "Is a directory", setup=mkdir("run/plugins.json/x"), keep_run_dir=True),
    X("evaluate_nothing_to_evaluate", (CMD, Q, "--set", "run.mode=evaluate"), "{m}",
      "nothing to evaluate", "{d}/run/checkpoints holds no verified checkpoint"),
    # issue 42: a manifest without [checkpoint] saves nothing, so "train the run first" would
    # not help: the hint says how to add the table
    Case("evaluate_without_checkpoint_table", "files", text=standalone(), standalone=True,
         argv=(CMD, Q, "--set", "run.mode=evaluate"), where="{m}",
         phrases=("nothing to evaluate: the manifest has no [checkpoint] table",
                  'hint: add [checkpoint] with type = "safetensors"')),
    X("export_run_without_checkpoint_table", ("export", "{d}/r", "--format", "safetensors"),
      "{d}/r/checkpoints holds no checkpoint to export",
      "({d}/r/manifest.resolved.toml) has no [checkpoint] table",
      'hint: add [checkpoint] with type = "safetensors" to the manifest', commands=("-",),
      setup=lambda d: (write("r/manifest.resolved.toml", '[run]\nname = "r"\n')(d),
                       mkdir("r/checkpoints")(d))),
    X("export_run_without_checkpoints", ("export", "{d}/r", "--format", "safetensors"),
      "{d}/r/checkpoints holds no verified checkpoint to export", "train the run first",
      commands=("-",),
      setup=lambda d: (write("r/manifest.resolved.toml", '[checkpoint]\ntype = "safetensors"\n')(d),
                       mkdir("r/checkpoints")(d))),
    # [step] and [models.NAME] -------------------------------------------------------------------
    M("models_without_step", '[models.teacher]\ntype = "mlp"\ninit_from = "t"\n', "{m}:1:",
      "[models.teacher] is run only by a [step]", "add [step]"),
    M("models_not_frozen", '[step]\ntype = "distill"\n[models.teacher]\ntype = "mlp"\n'
      'frozen = false\ninit_from = "t"\n', "{m}:5:", "models.teacher.frozen = false",
      "not supported"),
    M("models_without_init_from", '[step]\ntype = "distill"\n[models.teacher]\ntype = "mlp"\n',
      "{m}:3:", "[models.teacher] has no init_from"),
    M("models_named_model", '[step]\ntype = "distill"\n[models.model]\ntype = "mlp"\n'
      'init_from = "t"\n', "{m}:3:", "what a step calls [model]"),
    M("models_empty", '[step]\ntype = "distill"\n[models]\n', "{m}:3:", "holds no model"),
    M("models_unknown_option", '[step]\ntype = "distill"\n[models.teacher]\ntype = "mlp"\n'
      'init_from = "t"\nhiden = [8]\n', "{m}:6:", "hidden"),
    M("models_init_from_not_a_checkpoint", '[step]\ntype = "distill"\n[models.teacher]\n'
      'type = "mlp"\nhidden = [32]\ninit_from = "{d}"\n', "models.teacher.init_from",
      "commit.json"),
    M("models_with_tables", '[step]\ntype = "distill"\n[models.teacher]\ntype = "dlrm"\n'
      'init_from = "t"\n', "[models.teacher] model 'dlrm'", "sparse embedding tables",
      "a frozen model does not load"),
    M("step_unknown_type", '[step]\ntype = "distil"\n', "{m}:2:", "distill"),
    M("step_unknown_option", '[step]\ntype = "distill"\nalpah = 0.5\n', "{m}:3:", "alpha"),
    # checkpoint keys ----------------------------------------------------------------------------
    M("checkpoint_best_metric_without_split",
      '[checkpoint]\nkeep_best = 1\nbest_metric = "loss"\n', "{m}:3:", "not <split>.<key>"),
    M("checkpoint_init_include_bad_regex", '[checkpoint]\ninit_include = "("\n', "{m}:2:",
      "checkpoint.init_include", "invalid regular expression"),
    M("checkpoint_init_rename_not_a_table", '[checkpoint]\ninit_rename = "a"\n', "{m}:2:",
      "must be a table"),
    M("checkpoint_init_rename_value_not_a_string", '[checkpoint.init_rename]\n"a." = 1\n',
      "{m}:2:", "must be a string"),
    M("hooks_sharing_a_state_label",
      'hooks = [{type = "early_stopping"}, {type = "early_stopping"}]\n', "[hooks[1]]",
      "label 'early_stopping'", "distinct"),
    # data ---------------------------------------------------------------------------------------
    D("data_path_missing", ("data.train.path={d}/nope",), "{d}/nope", "[data.train]"),
    D("data_path_empty_directory", ("data.train.path={d}/empty",),
      "{d}/empty/train-images-idx3-ubyte.gz", "[data.train]", setup=mkdir("empty")),
    D("data_path_is_a_file", ("data.train.path={d}/small.toml",), "{d}/small.toml",
      "[data.train]"),
    D("data_path_is_a_fifo", ("data.train.path={d}/pipe",), "{d}/pipe", "[data.train]",
      setup=mkfifo("pipe")),
    D("data_file_is_a_fifo", ("data.train.path={d}/fm",), "{d}/fm/train-images-idx3-ubyte.gz",
      "FIFO", setup=fashion_copy("fm", os.mkfifo)),
    D("data_file_is_a_directory", ("data.train.path={d}/fm",),
      "{d}/fm/train-images-idx3-ubyte.gz", "directory", setup=fashion_copy("fm", os.mkdir)),
    D("data_file_not_gzip", ("data.train.path={d}/fm",), "{d}/fm/train-images-idx3-ubyte.gz",
      setup=fashion_copy("fm", not_gzip)),
    D("data_file_truncated", ("data.train.path={d}/fm",), "{d}/fm/train-images-idx3-ubyte.gz",
      "truncated", setup=fashion_copy("fm", truncated_gzip)),
    D("data_test_path_missing", ("data.test.path={d}/nope",), "{d}/nope", "[data.test]"),
    D("data_no_batches", ("data.train.batch_size=512", "data.train.drop_last=true"),
      "[data.train]", "no batch"),
    D("data_error_keeps_existing_run_dir", ("data.train.path={d}/nope",), "{d}/nope",
      keep_run_dir=True),
    # data: the tokens dataset (plugins/tokens) and keel prepare
    Case("tokens_file_missing", "data", text=tokens_manifest("nope.bin"), standalone=True,
         where="{d}/nope.bin", phrases=("cannot open the token file", "[data.train] path"),
         setup=token_files),
    Case("tokens_file_odd_size", "data", text=tokens_manifest("odd.bin"), standalone=True,
         where="{d}/odd.bin", phrases=("size 41 bytes is not a multiple of 2",),
         setup=token_files),
    Case("tokens_context_longer_than_split", "data", text=tokens_manifest("ok.bin", 200),
         standalone=True, where="{d}/ok.bin",
         phrases=("split 'train' holds 90 tokens (of 100", "context 200"), setup=token_files),
    Case("tokens_vocab_missing", "data", text=tokens_manifest("sub/ok.bin"), standalone=True,
         where="{d}/sub/vocab.json", phrases=("keel prepare",), setup=mkdir("sub")),
    X("prepare_input_missing", ("prepare", "{d}/nope.txt", "--output", "{d}/out"),
      "{d}/nope.txt", "cannot open the text file", commands=("-",)),
    X("prepare_only_separators", ("prepare", "{d}/in.txt", "--output", "{d}/out", "--documents",
                                  "%"), "{d}/in.txt", "holds no document", commands=("-",),
      setup=write("in.txt", "%%%")),
    X("prepare_invalid_utf8", ("prepare", "{d}/in.txt", "--output", "{d}/out"), "{d}/in.txt",
      "invalid UTF-8 at byte offset 3", "--level byte", commands=("-",),
      setup=write_bytes("in.txt", b"abc\xff\n")),
    # keel prepare's output directory gets the run directory's rules (issue 43, finding 7): not
    # a symlink (another user's, into your files), not under a directory others can write.
    X("prepare_output_symlinked", ("prepare", "{d}/in.txt", "--output", "{d}/out"), "{d}/out",
      "is a symbolic link", "--output", commands=("-",),
      setup=lambda d: (write("in.txt", "abc\n")(d), write("victim/tokens.bin", "old")(d),
                       os.symlink(f"{d}/victim", f"{d}/out"))),
    X("prepare_output_in_world_writable", ("prepare", "{d}/in.txt", "--output", "{d}/shared/out"),
      "{d}/shared", "is writable by every user", "hint: give --output", commands=("-",),
      setup=lambda d: (write("in.txt", "abc\n")(d), mkdir("shared")(d),
                       os.chmod(f"{d}/shared", 0o777))),
    # files: keel report (not the case's run directory: the check wants that one absent)
    X("report_run_dir_missing", ("report", "{d}/nope"), "{d}/nope", "is not a directory",
      commands=("-",)),
    X("report_without_metrics", ("report", "{d}/r"), "{d}/r/metrics.jsonl", "does not exist",
      commands=("-",), setup=mkdir("r")),
    X("report_metrics_malformed", ("report", "{d}/r"), "{d}/r/metrics.jsonl:2",
      "not a metrics record", commands=("-",),
      setup=write("r/metrics.jsonl", '{"split": "train", "step": 4, "loss": 2.3}\n{"step": \n')),
    X("report_metrics_without_step", ("report", "{d}/r"), "{d}/r/metrics.jsonl:1",
      "numeric \"step\"", commands=("-",), setup=write("r/metrics.jsonl", '{"loss": 2.3}\n')),
    X("report_output_is_a_directory", ("report", "{d}/r", "--output", "{d}/r"), "{d}/r",
      "is a directory", commands=("-",), setup=write("r/metrics.jsonl", '{"step": 1}\n')),
]


def shift_lines(c: Case) -> str:
    """`where` with its {m}:LINE counted in keel's file: case.toml is the case's text below an
    `extends = "small.toml"` line (unless standalone), and `where` counts from the text."""
    if c.text is None or c.standalone:
        return c.where
    return re.sub(r"\{m\}:(\d+)", lambda mo: "{m}:%d" % (int(mo.group(1)) + 1), c.where)


class Result(NamedTuple):
    case: Case
    command: str
    mode: str  # "inproc" (keel_inproc) or "process" (a keel process)
    argv: Tuple[str, ...]
    d: str
    returncode: Optional[int]  # None: timed out
    stdout: str
    stderr: str
    before: Tuple[str, ...]
    after: Tuple[str, ...]
    run_dir_before: Optional[Tuple[str, ...]]
    run_dir_after: Optional[Tuple[str, ...]]
    skipped: str = ""
    leaks: Tuple[str, ...] = ()  # in-process: global state the case left changed


def listing(d):
    out = []
    for dirpath, dirnames, filenames in os.walk(d):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            try:
                size = os.lstat(p).st_size if stat.S_ISREG(os.lstat(p).st_mode) else -1
            except OSError:
                size = -2
            out.append(f"{os.path.relpath(p, d)} {size}")
    return tuple(sorted(out))


POOL: Optional[inproc.Pool] = None  # the keel_inproc runners, while the catalogue runs


def run_one(case: Case, command: str, mode: str) -> Result:
    d = tempfile.mkdtemp(prefix=f"keel-bad-{case.name}-")
    try:
        return _run_in(case, command, d, mode)
    finally:
        for dirpath, dirnames, _ in os.walk(d):
            for n in dirnames:
                os.chmod(os.path.join(dirpath, n), 0o700)
        shutil.rmtree(d, ignore_errors=True)


def _run_in(case: Case, command: str, d: str, mode: str) -> Result:
    m = os.path.join(d, "case.toml")
    with open(os.path.join(d, "small.toml"), "w") as f:
        f.write(SMALL.format(quickstart=QUICKSTART, d=d))
    text = case.text if case.text is not None else ""
    if not case.standalone:
        text = 'extends = "small.toml"\n' + text
    with open(m, "w") as f:
        f.write(text.replace("{d}", d))
    if case.setup:
        case.setup(d)
    run_dir = os.path.join(d, "run")
    if case.keep_run_dir:
        os.makedirs(run_dir, exist_ok=True)  # (setup may have made it)
        with open(os.path.join(run_dir, "keep.txt"), "w") as f:
            f.write("keep me\n")

    def fill(s):
        return s.replace("{cmd}", command).replace("{m}", m).replace("{d}", d)

    if case.argv is not None:
        argv = tuple(fill(a) for a in case.argv)
    else:
        argv = (command, m) + tuple(x for s in case.sets for x in ("--set", fill(s)))
    prefix = []
    skipped = ""
    if case.as_nobody:
        if os.geteuid() == 0:
            # Root reads any file: run keel as nobody so that permissions apply.
            if shutil.which("setpriv") is None:
                skipped = "running as root and setpriv is missing"
            prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            os.chmod(d, 0o755)
    keel = keel_for_nobody() if prefix else KEEL
    if prefix and not skipped:
        skipped = nobody_cannot_start(prefix, keel)
    env = dict(os.environ)
    env.pop("KEEL_LOG_LEVEL", None)
    env.update(case.env or {})
    before = listing(d)
    run_before = listing(run_dir) if os.path.isdir(run_dir) else None
    if skipped:
        return Result(case, command, mode, argv, d, 0, "", "", before, before, run_before,
                      run_before, skipped)
    leaks = ()
    if mode == "inproc":
        o = POOL.run(["keel", *argv], cwd=d, env=case.env, unset=["KEEL_LOG_LEVEL"])
        rc, out, err, leaks = o.returncode, o.stdout, o.stderr, tuple(o.leaks)
    else:
        try:
            # argv[0] "keel", as in-process (hints name keel as it was run), except as another
            # user, where setpriv starts that keel.
            p = subprocess.run(prefix + [keel, *argv] if prefix else ["keel", *argv],
                               executable=None if prefix else keel, capture_output=True,
                               text=True, cwd=d, env=env, timeout=TIMEOUT_S, errors="replace")
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = None, str(e.stdout or ""), str(e.stderr or "")
    return Result(case, command, mode, argv, d, rc, out, err, before, listing(d), run_before,
                  listing(run_dir) if os.path.isdir(run_dir) else None, leaks=leaks)


# The cases that also run as keel processes, their results compared with the in-process ones:
# every 20th case of the catalogue, and those whose point is an environment variable.
PROCESS_SAMPLE = frozenset([c.name for c in CASES[::20]] + [c.name for c in CASES if c.env])


SANITIZED = inproc.SANITIZED


def modes(c: Case) -> Tuple[str, ...]:
    if c.as_nobody:  # another user: setpriv starts a keel process
        return ("process",)
    return ("inproc", "process") if c.name in PROCESS_SAMPLE and not SANITIZED else ("inproc",)


def commands(c: Case) -> Tuple[str, ...]:
    return c.commands[-1:] if SANITIZED else c.commands


def runner_env():
    env = dict(os.environ)
    env.pop("KEEL_LOG_LEVEL", None)
    return env


class Catalogue(unittest.TestCase):
    results: List[Result] = []
    runner_problems: List[str] = []

    @classmethod
    def setUpClass(cls):
        global POOL
        jobs = int(os.environ.get("KEEL_TEST_JOBS", os.cpu_count() or 1))
        only = re.compile(os.environ.get("KEEL_CASES", ""))
        work = [(c, cmd, mode) for c in CASES for cmd in commands(c) for mode in modes(c)
                if only.search(c.name)]
        # The slow ones first (train reads Fashion-MNIST), so that no runner is left with them
        # at the end.
        work.sort(key=lambda w: (w[1] != "train", w[2] != "process"))
        POOL = inproc.Pool(INPROC, TIMEOUT_S, env=runner_env())
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                cls.results = list(pool.map(lambda w: run_one(*w), work))
        finally:
            cls.runner_problems = POOL.close()
            if NOBODY_KEEL is not None:
                shutil.rmtree(os.path.dirname(NOBODY_KEEL))
            POOL = None
        kinds = collections.Counter(c.kind for c in CASES)
        runs = collections.Counter(w[2] for w in work)
        print(f"\nbad-input catalogue: {len(CASES)} cases ("
              + ", ".join(f"{k} {kinds[k]}" for k in
                          ("manifests", "extends", "set", "flags", "files", "data"))
              + f"), {len(work)} keel runs: {runs['inproc']} in-process, {runs['process']} as "
              f"keel processes", file=sys.stderr)

    def test_runners_exit_clean(self):
        """Every keel_inproc ended with status 0 (under the sanitizers: no leak at exit)."""
        self.assertEqual(self.runner_problems, [])

    def test_inproc_matches_process(self):
        """The sample run both ways gives the same exit status, stderr and stdout."""
        by_key = collections.defaultdict(dict)
        for r in self.results:
            by_key[(r.case.name, r.command)][r.mode] = r
        pairs = [k for k, v in by_key.items() if len(v) == 2]
        if SANITIZED:
            self.skipTest("no process sample under the sanitizers")
        if os.environ.get("KEEL_CASES") is None:
            self.assertGreaterEqual(len(pairs), 10)
        for key in pairs:
            a, b = by_key[key]["inproc"], by_key[key]["process"]
            with self.subTest(case=key[0], command=key[1]):
                self.assertEqual(
                    (a.returncode, inproc.normalized(a.stderr, a.d), inproc.normalized(a.stdout, a.d)),
                    (b.returncode, inproc.normalized(b.stderr, b.d), inproc.normalized(b.stdout, b.d)))

    def test_names_are_unique(self):
        names = [c.name for c in CASES]
        self.assertEqual(len(names), len(set(names)))
        self.assertGreaterEqual(len(CASES), 60)

    def test_catalogue(self):
        for r in self.results:
            with self.subTest(case=r.case.name, command=r.command):
                if r.skipped:
                    self.skipTest(r.skipped)
                self.check(r)

    def test_validate_agrees_with_train(self):
        """`keel validate` checks everything `keel train` does before step 1: a case run through
        both gives the same exit status and the same error line (its case directory, which
        differs, written as {d}); but usage errors, which name the command."""
        by_key = collections.defaultdict(dict)
        for r in self.results:
            if (r.mode == "inproc" or r.case.as_nobody) and r.case.status == 1:
                by_key[r.case.name][r.command] = r
        pairs = [(v["validate"], v["train"]) for v in by_key.values()
                 if "validate" in v and "train" in v]
        if SANITIZED:
            self.skipTest("each case runs through one command under the sanitizers")
        if os.environ.get("KEEL_CASES") is None:
            self.assertGreaterEqual(len(pairs), 100)

        def error_line(r):
            errors = [l for l in r.stderr.splitlines() if l.startswith("keel: error: ")]
            return r.returncode, [l.replace(r.d, "{d}") for l in errors]
        for v, t in pairs:
            with self.subTest(case=v.case.name):
                self.assertEqual(error_line(v), error_line(t),
                                 f"\n  validate: {v.stderr!r}\n  train: {t.stderr!r}")

    def test_hints(self):
        """The error line ends with `; hint: <what to do>` (the project's format)."""
        for r in self.results:
            with self.subTest(case=r.case.name, command=r.command):
                if r.skipped:
                    self.skipTest(r.skipped)
                errors = [l for l in r.stderr.splitlines() if l.startswith("keel: error: ")]
                if len(errors) != 1:
                    self.skipTest("no single error line (test_catalogue reports it)")
                self.assertRegex(errors[0], r"; hint: \S", f"\n  keel {' '.join(r.argv)}")

    def check(self, r: Result):
        c = r.case
        context = (f"\n  keel {' '.join(r.argv)} ({r.mode})\n  exit {r.returncode}\n  stderr: "
                   f"{r.stderr!r}\n  stdout tail: {r.stdout[-600:]!r}")
        self.assertEqual(r.leaks, (), "process-global state left changed" + context)
        self.assertIsNotNone(r.returncode, "keel hung (killed after %d s)%s" % (TIMEOUT_S, context))
        if r.returncode < 0:
            self.fail(f"killed by signal {signal.Signals(-r.returncode).name}{context}")
        self.assertEqual(r.returncode, c.status, "exit status" + context)
        lines = r.stderr.splitlines()
        errors = [l for l in lines if l.startswith("keel: error: ")]
        self.assertEqual(len(errors), 1, "one `keel: error: ` line" + context)
        others = [l for l in lines if not l.startswith("keel: error: ")]
        if c.status == 2:
            self.assertTrue(all(l.startswith("usage: ") for l in others) and len(others) <= 1,
                            "a usage error: the error line and at most one usage line" + context)
        else:
            self.assertEqual(others, [], "nothing but the error line on stderr" + context)
        line = errors[0]
        fill = lambda s: s.replace("{m}", os.path.join(r.d, "case.toml")).replace("{d}", r.d)
        self.assertIn(fill(shift_lines(c)), line, "names the place" + context)
        for phrase in c.phrases:
            self.assertIn(fill(phrase), line, context)
        self.assertIsNone(re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f]", r.stderr),
                          "no control byte on stderr (data bytes quoted as \\xNN)" + context)
        for bad in FORBIDDEN:
            self.assertNotIn(bad, r.stderr, context)
            self.assertNotIn(bad, r.stdout, context)
        self.assertEqual(r.after, r.before, "nothing left behind in the case directory" + context)
        if c.keep_run_dir:
            self.assertEqual(r.run_dir_after, r.run_dir_before,
                             "the existing run directory holds what it held" + context)
        else:
            self.assertIsNone(r.run_dir_after, "no run directory left behind" + context)


class ProcessState(unittest.TestCase):
    """keel::cli_main puts back the process-global state a command changes: a case gives the same
    result first in a runner and after cases that raised the log level (flag and
    KEEL_LOG_LEVEL), attached a run log, installed the SIGINT/SIGTERM handlers and set the
    thread count (a training run)."""

    def test_reset_between_cases(self):
        with tempfile.TemporaryDirectory() as d:
            small = os.path.join(d, "small.toml")
            with open(small, "w") as f:
                f.write(SMALL.format(quickstart=QUICKSTART, d=d))
            # (--overwrite: after the training run, validate without it refuses its records)
            probe = ["keel", "validate", small, "--overwrite"]
            pool = inproc.Pool(INPROC, TIMEOUT_S, env=runner_env())
            try:
                first = pool.run(probe, cwd=d)
                train = pool.run(["keel", "train", small, "--log-level", "trace", "--set",
                                  "train.max_steps=1", "--set", "run.threads=1"], cwd=d)
                env_level = pool.run(probe, cwd=d, env={"KEEL_LOG_LEVEL": "debug"})
                again = pool.run(probe, cwd=d)
            finally:
                problems = pool.close()
        self.assertEqual(problems, [])
        for o in (first, train, env_level, again):
            self.assertEqual((o.returncode, o.leaks), (0, []), o.stderr)
        # The changes happened: debug lines on the console, a run log.
        self.assertIn("command line: keel train", train.stdout)
        self.assertIn("run log: ", train.stdout)
        self.assertIn("command line: keel validate", env_level.stdout)
        # ... and were undone: info level again (no debug line), as in the first run.
        self.assertTrue(first.stdout.endswith(f"{small}: ok (run 'quickstart' -> {d}/run)\n"),
                        first.stdout)
        self.assertNotIn("command line:", first.stdout + again.stdout)
        self.assertEqual((inproc.normalized(again.stdout), again.stderr),
                         (inproc.normalized(first.stdout), first.stderr))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[4:], verbosity=2)
