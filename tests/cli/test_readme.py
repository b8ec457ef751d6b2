"""The README's command sequences, run verbatim on a clean copy of the checkout.

A newcomer types the README's commands in order, in a fresh clone; a sequence that only works
in a developer's tree (a run directory left over, a data file prepared by hand) or whose lines
contradict each other (a --resume after a changed option) fails them on their first day. This
test copies the checkout's tracked files (`git ls-files`, as a clone has them, with the working
tree's contents) into a new directory, gives the copy the build directory this test was built in
(`build` -> a symbolic link to it: the copy is not built again), and runs, each command line
exactly as the README's ```sh blocks write it (comments dropped, `\\` continuations joined):

- command 1, `./setup.sh && build/kernel/keel train configs/quickstart.toml` (setup.sh finds
  every package installed and the build up to date, and prepares data/fortunes/ when
  `fortunes` is installed);
- every line of the block of "A first run: the quickstart", in order;
- every line of the first block of "Recommendation training" (the small data set), in order;
- the block of "Several processes" (the quickstart on 2 processes under torchrun).

Each line must exit 0. After them it checks what the lines say they do: the quickstart's
--overwrite run replaced the first run's records, `--resume` continued its newest checkpoint
(the log names it and the records go on past its step), `keel report` wrote the report, and
the small recommendation run evaluated its test window, saved checkpoints and exported the
newest one with its tables, and the 2-process run saved a checkpoint of 2 ranks.

Not run here: the language model's block (about 5 minutes of training: docs/performance.md),
and the recommendation block of the full data set (480 MB, 1.5 minutes).

Usage: test_readme.py BUILD_DIR SOURCE_DIR (the suite 'ci', tests/cli/meson.build)
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import tomllib
import unittest

BUILD = os.path.realpath(sys.argv[1])
SOURCE = os.path.realpath(sys.argv[2])
TIMEOUT_S = 600


def readme_blocks(text):
    """Heading (without the #s) -> the command lines of its first ```sh block."""
    blocks, heading, i = {}, None, 0
    lines = text.splitlines()
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.strip() == "```sh" and heading is not None and heading not in blocks:
            body = []
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            blocks[heading] = command_lines(body)
        i += 1
    return blocks


def command_lines(body):
    """A block's commands: `\\` continuations joined, comments and blank lines dropped."""
    out, pending = [], ""
    for raw in body:
        line = raw.rstrip()
        if pending:
            line = pending + " " + line.lstrip()
            pending = ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        line = without_comment(line).rstrip()
        if line:
            out.append(line)
    return out


def without_comment(line):
    """The line up to its first '#' that starts a word outside quotes (shell comment)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


class Readme(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="keel-readme-")
        cls.clone = os.path.join(cls.tmp, "keel")
        files = subprocess.run(["git", "-C", SOURCE, "ls-files", "-z"], check=True,
                               capture_output=True).stdout.decode().split("\0")
        for f in filter(None, files):
            src, dst = os.path.join(SOURCE, f), os.path.join(cls.clone, f)
            if not os.path.lexists(src):
                continue  # deleted in the working tree, not yet committed
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)
        os.symlink(BUILD, os.path.join(cls.clone, "build"))
        with open(os.path.join(cls.clone, "README.md")) as f:
            cls.blocks = readme_blocks(f.read())
        cls.log = []

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def run_line(self, line):
        p = subprocess.run(["bash", "-eo", "pipefail", "-c", line], cwd=self.clone,
                           capture_output=True, text=True, timeout=TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
        self.log.append((line, p.returncode, p.stdout, p.stderr))
        self.assertEqual(p.returncode, 0, f"README line failed: {line}\n--- stdout\n"
                         f"{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}")
        return p

    def block(self, heading):
        self.assertIn(heading, self.blocks, f"README.md has no ```sh block under '{heading}'")
        lines = self.blocks[heading]
        self.assertTrue(lines, f"README.md's block under '{heading}' has no command")
        return lines

    def records(self, run_dir, split="train"):
        """The run's metric records of `split` ("train", or "test" for [data.test])."""
        with open(os.path.join(self.clone, run_dir, "metrics.jsonl")) as f:
            return [r for r in map(json.loads, f) if r.get("split") == split]

    def test_1_quickstart(self):
        command1 = [line for line in self.block("The two commands")
                    if "setup.sh --tests" not in line]
        self.assertEqual(len(command1), 1, command1)
        self.run_line(command1[0])
        run = "runs/quickstart"
        first = self.records(run)
        self.assertTrue(first, "the quickstart wrote no train records")
        ran = []
        for line in self.block("A first run: the quickstart"):
            p = self.run_line(line)
            ran.append((line, p))
        lines = [line for line, _ in ran]
        overwrite = [i for i, line in enumerate(lines) if " train " in line and "--overwrite" in line]
        resume = [i for i, line in enumerate(lines) if " train " in line and "--resume" in line]
        self.assertEqual(len(overwrite), 1, lines)
        self.assertEqual(len(resume), 1, lines)
        self.assertLess(overwrite[0], resume[0], "the block resumes before it trains again")
        # --resume continued the newest checkpoint of the --overwrite run: it names it, and the
        # records go on past its step.
        p = ran[resume[0]][1]
        said = p.stdout + p.stderr
        m = re.search(r"checkpoints/step-(\d+)", said)
        self.assertIsNotNone(m, f"--resume named no checkpoint:\n{said[-3000:]}")
        resumed_from = int(m.group(1))
        steps = [r["step"] for r in self.records(run)]
        self.assertGreater(max(steps), resumed_from, "--resume trained no step")
        self.assertTrue(os.path.isfile(os.path.join(self.clone, run, "report.html")))

    def test_2_recommendation(self):
        for line in self.block("Recommendation training"):
            self.run_line(line)
        run = "runs/ctr_small"
        # 7 windows trained, the held-out 8th evaluated after each, near its Bayes AUC.
        evals = self.records(run, split="test")
        self.assertEqual(len(evals), 7)
        with open(os.path.join(self.clone, "data/ctr-small/truth.json")) as f:
            bayes = json.load(f)["per_window"][7]["bayes_auc"]
        self.assertGreater(evals[-1]["auc"], 0.75, evals[-1])
        self.assertLess(evals[-1]["auc"], bayes + 0.01, (evals[-1], bayes))
        self.assertEqual(self.records(run)[-1]["samples"], 7 * 20000)
        # A checkpoint after each window; the export holds the newest one's 26 tables.
        ckpts = [n for n in os.listdir(os.path.join(self.clone, run, "checkpoints"))
                 if n.startswith("step-")]
        self.assertEqual(len(ckpts), 7, ckpts)
        newest = max(ckpts, key=lambda n: int(n.split("-")[1]))
        export = os.path.join(self.clone, run, "exports", newest)
        self.assertTrue(os.path.isfile(os.path.join(export, "model.safetensors")))
        with open(os.path.join(export, "tables.safetensors"), "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        self.assertEqual(len([k for k in header if k != "__metadata__"]), 2 * 26)

    def test_3_several_processes(self):
        for line in self.block("Several processes"):
            self.run_line(line)
        ckpts = os.path.join(self.clone, "runs/quickstart_2ranks/checkpoints")
        newest = max((n for n in os.listdir(ckpts) if n.startswith("step-")),
                     key=lambda n: int(n.split("-")[1]))
        with open(os.path.join(ckpts, newest, "trainer_state.toml"), "rb") as f:
            self.assertEqual(tomllib.load(f).get("world_size"), 2)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
