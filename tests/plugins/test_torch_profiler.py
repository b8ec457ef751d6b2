"""Operator profiling end to end: configs/quickstart.toml (the MLP 784 -> 256 -> 128 -> 10, batch
64) trained for a few steps with [profiler] type = "chrome_trace", operators = true, and the
trace it writes checked: valid Chrome trace JSON, the phases and the LibTorch operators of the
chosen steps only, input shapes and FLOPs that match the model, memory events; then, through
torch_profiler_probe, the fallback when LibTorch's profiler cannot start and the cost of the
marks outside the step range. Both probe cases run in one `torch_profiler_probe --batch` process
(tests/plugins/probe.hpp); every file is in a temporary directory (tempfile).
Usage: test_torch_profiler.py KEEL_BINARY SOURCE_ROOT PROBE PROFILER_PLUGIN"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

from probe_batch import Batch

KEEL, ROOT, PROBE, PLUGIN = (os.path.abspath(a) for a in sys.argv[1:5])
START, END, STEPS = 3, 5, 8  # steps 3..5 recorded of 8
BATCH = 64
# The MLP's layers (in, out), as aten::addmm sees them: bias [out], input [64, in], weight^T.
LAYERS = [(784, 256), (256, 128), (128, 10)]


def train(d, profiler, *sets):
    manifest = os.path.join(d, "m.toml")
    with open(manifest, "w") as f:
        f.write(f'extends = "{ROOT}/configs/quickstart.toml"\n[profiler]\n'
                'type = "chrome_trace"\n' + profiler)
    args = [KEEL, "train", manifest, "--set", "data.train.limit=640", "--set",
            "data.test.limit=100", "--set", "train.epochs=1", "--set",
            f"train.max_steps={STEPS}", "--set", "checkpoint.at_end=false", "--set",
            f"run.output_dir={d}/run", *sets]
    env = {k: v for k, v in os.environ.items() if k != "KEEL_LOG_LEVEL"}
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)


class TorchProfiler(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.probes = Batch(PROBE)  # the probe cases of the class, in one process

    @classmethod
    def tearDownClass(cls):
        status = cls.probes.close()
        if status != 0:
            raise AssertionError(f"torch_profiler_probe --batch exited with status {status}")

    def test_operators_of_the_chosen_steps(self):
        with tempfile.TemporaryDirectory() as d:
            p = train(d, f'path = "profile/ops.trace.json"\nstart_step = {START}\n'
                         f'end_step = {END}\noperators = true\n')
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(d, "run/profile/ops.trace.json")) as f:
                trace = json.load(f)

        # A Chrome trace: an object with a traceEvents list of complete or instant events.
        self.assertIsInstance(trace, dict)
        events = trace["traceEvents"]
        self.assertIsInstance(events, list)
        for e in events:
            for key in ("name", "ph", "ts", "pid", "tid"):
                self.assertIn(key, e)
            self.assertIsInstance(e["ts"], (int, float))
            self.assertIn(e["ph"], ("X", "i"))
            if e["ph"] == "X":
                self.assertGreaterEqual(e["dur"], 0)

        phases = [e for e in events if e["pid"] == 0]
        ops = [e for e in events if e["pid"] == 1 and e["ph"] == "X"]
        memory = [e for e in events if e["pid"] == 1 and e["ph"] == "i"]

        # Phases: the steps in range only, one forward and one optimizer step each.
        self.assertEqual({e["args"]["step"] for e in phases}, set(range(START, END + 1)))
        n = END - START + 1
        self.assertEqual(sum(e["name"] == "forward" for e in phases), n)
        self.assertEqual(sum(e["name"] == "optimizer" for e in phases), n)

        # Operators: one aten::addmm per layer and step (none from the other steps, nor from
        # the evaluation at the end, whose batch is 100), with the model's shapes and FLOPs.
        addmm = [e for e in ops if e["name"] == "aten::addmm"]
        self.assertEqual(len(addmm), len(LAYERS) * n)
        expected = {f"[[{o}], [{BATCH}, {i}], [{i}, {o}], [], []]": 2 * BATCH * i * o
                    for i, o in LAYERS}
        for e in addmm:
            shapes = e["args"]["input_shapes"]
            self.assertIn(shapes, expected)
            self.assertEqual(e["args"]["flops"], expected[shapes])
            out = int(shapes[2:shapes.index("]")])
            self.assertEqual(e["args"]["cpu_memory_bytes"], BATCH * out * 4)  # the float output
        first = [e for e in addmm if e["args"]["input_shapes"].startswith("[[256], [64, 784]")]
        self.assertEqual(len(first), n)  # the 784 -> 256 layer, once per step
        self.assertEqual(sum(e["name"] == "AddmmBackward0" for e in ops), len(LAYERS) * n)

        # Every operator lies within the recorded steps, on the phases' time axis.
        lo = min(e["ts"] for e in phases)
        hi = max(e["ts"] + e["dur"] for e in phases)
        for e in ops + memory:
            self.assertGreaterEqual(e["ts"], lo - 2, e["name"])  # 2 us: the clocks' rounding
            self.assertLessEqual(e["ts"] + e.get("dur", 0), hi + 2, e["name"])

        # Memory: each CPU allocation (bytes > 0) and free (bytes < 0) as an instant event.
        self.assertTrue(memory)
        for e in memory:
            self.assertEqual(e["name"], "[memory]")
            self.assertNotEqual(e["args"]["bytes"], 0)
        self.assertTrue(any(e["args"]["bytes"] > 0 for e in memory))
        self.assertTrue(any(e["args"]["bytes"] < 0 for e in memory))

    def test_shapes_and_memory_off(self):
        with tempfile.TemporaryDirectory() as d:
            p = train(d, f'start_step = {START}\nend_step = {START}\noperators = true\n'
                         'record_shapes = false\nprofile_memory = false\n')
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(d, "run/trace.json")) as f:
                events = json.load(f)["traceEvents"]
        addmm = [e for e in events if e["name"] == "aten::addmm"]
        self.assertEqual(len(addmm), len(LAYERS))
        for e in addmm:
            self.assertEqual(e["args"], {"input_shapes": "[]"})
        self.assertFalse([e for e in events if e["name"] == "[memory]"])

    def test_operators_need_an_end_step(self):
        with tempfile.TemporaryDirectory() as d:
            p = train(d, "operators = true\n")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("operators = true needs an end_step", p.stderr)
        self.assertNotIn("Traceback", p.stderr)

    def run_probe(self, mode, run_dir):
        """torch_profiler_probe in `mode`; asserts it succeeded and returns its stdout lines."""
        out, err = self.probes.run(PLUGIN, mode, run_dir)
        self.assertIsNone(err)
        return out.splitlines()

    def test_profiler_busy_falls_back_to_phases(self):
        # LibTorch's profiler already on in the thread: one warning, the run goes on, and the
        # trace holds the phases only.
        with tempfile.TemporaryDirectory() as d:
            lines = self.run_probe("busy", d)
            self.assertEqual(lines[-1], "ok")
            warnings = [line for line in lines if "operators not recorded" in line]
            self.assertEqual(len(warnings), 1, "\n".join(lines))
            self.assertIn("LibTorch's profiler did not start", warnings[0])
            self.assertIn("already enabled", warnings[0])
            self.assertIn("the phases are still recorded", warnings[0])
            with open(os.path.join(d, "trace.json")) as f:
                events = json.load(f)["traceEvents"]
        self.assertEqual([(e["name"], e["args"]["step"]) for e in events], [("forward", 1)])

    def test_profiler_is_on_in_the_range_only(self):
        with tempfile.TemporaryDirectory() as d:
            lines = self.run_probe("marks", d)
        enabled = dict(tuple(map(int, x.split(":"))) for x in lines[0].split()[1:])
        # steps 5..6 in range: LibTorch's profiler is on from step 5's first mark to step 7's.
        self.assertEqual(enabled, {s: int(5 <= s <= 6) for s in range(9)})
        outside, plain = (float(x) for x in lines[1].split()[1:3])
        # Information only (tests check behaviour; timings belong to bench/): outside the range
        # a mark is a call through the ABI and a comparison.
        print(f"\n  begin+end outside the range: {outside:.1f} ns with operators, "
              f"{plain:.1f} ns without", file=sys.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
