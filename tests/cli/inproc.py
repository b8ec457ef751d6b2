"""Runs keel command lines through keel_inproc (tests/cli/keel_inproc.cpp): many cases in one process
through keel::cli_main, the function the `keel` executable runs, instead of one keel process (and
one LibTorch start-up) per case. Used by test_bad_input.py, test_misbehave.py, test_cli.py and
test_packages.py.

Each thread that calls Pool.run gets a runner process of its own. A case that outlives the timeout
kills its runner (the case reads as hung: returncode None); a case that ends its runner (keel's
internal-error exit 70, a signal) gets the runner's exit status as its own, as a keel process
would; either way the next case starts a fresh runner. Pool.close ends the runners and returns
what went wrong with them (an exit status other than 0: under the sanitizers, LeakSanitizer's
report at exit)."""
import json
import os
import re
import select
import subprocess
import tempfile
import threading
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple


# Whether this test runs under the sanitizers: meson's 'sanitizers' test setup sets ASAN_OPTIONS.
SANITIZED = "ASAN_OPTIONS" in os.environ


class Outcome(NamedTuple):
    returncode: Optional[int]  # None: hung (killed after the timeout); < 0: killed by a signal
    stdout: str
    stderr: str
    leaks: List[str]  # process-global state the case left changed (keel_inproc's check)


class _Runner:
    def __init__(self, exe: str, env: Dict[str, str], tmp: str, index: int,
                 preexec_fn: Optional[Callable[[], None]]):
        self.tmp = tmp
        self.log_path = os.path.join(tmp, f"runner-{index}.log")
        self.log = open(self.log_path, "ab")
        r, w = os.pipe()
        self.proc = subprocess.Popen([exe, str(w)], stdin=subprocess.PIPE, stdout=self.log,
                                     stderr=self.log, env=env, pass_fds=(w,), cwd=tmp,
                                     preexec_fn=preexec_fn)
        os.close(w)
        self.results = r
        self.buf = b""

    def run(self, case_id: int, argv: Sequence[str], cwd: str, env: Dict[str, str],
            unset: Sequence[str], timeout_s: float):
        out = os.path.join(self.tmp, f"{case_id}.out")
        err = os.path.join(self.tmp, f"{case_id}.err")
        for p in (out, err):  # a runner killed before it opened them: empty output
            open(p, "w").close()
        line = json.dumps({"id": case_id, "argv": list(argv), "cwd": cwd, "env": env,
                           "unset": list(unset), "stdout": out, "stderr": err}) + "\n"
        record, ended = None, False
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            ended = True
        while record is None and not ended:
            if b"\n" in self.buf:
                text, self.buf = self.buf.split(b"\n", 1)
                record = json.loads(text)
                break
            ready, _, _ = select.select([self.results], [], [], timeout_s)
            if not ready:  # hung
                self.proc.kill()
                self.proc.wait()
                return self._outcome(None, out, err, []), False
            chunk = os.read(self.results, 65536)
            if not chunk:
                ended = True
            self.buf += chunk
        if record is None:  # the case ended the runner
            rc = self.proc.wait()
            return self._outcome(rc, out, err, []), False
        assert record["id"] == case_id, (record, case_id)
        return self._outcome(record["status"], out, err, record["leaks"]), True

    @staticmethod
    def _outcome(rc, out, err, leaks):
        texts = []
        for p in (out, err):
            with open(p, "rb") as f:
                texts.append(f.read().decode(errors="replace"))
            os.unlink(p)
        return Outcome(rc, texts[0], texts[1], leaks)

    def close(self, timeout_s: float) -> str:
        """Ends the runner; '' when it exited 0, else what went wrong."""
        problem = ""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                rc = self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                rc = "killed after %d s" % timeout_s
            if rc != 0:
                self.log.flush()
                with open(self.log_path, "rb") as f:
                    problem = f"keel_inproc exited {rc}:\n" + f.read().decode(errors="replace")[-4000:]
        os.close(self.results)
        self.log.close()
        return problem


class Pool:
    """keel_inproc runners, one per calling thread, started on first use. preexec_fn, when given,
    runs in each runner process before keel_inproc starts (as subprocess.Popen's: a resource
    limit that all the pool's cases then run under)."""

    def __init__(self, exe: str, timeout_s: float, env: Optional[Dict[str, str]] = None,
                 preexec_fn: Optional[Callable[[], None]] = None):
        self.exe, self.timeout_s, self.preexec_fn = exe, timeout_s, preexec_fn
        self.env = dict(os.environ if env is None else env)
        self.tmp = tempfile.TemporaryDirectory(prefix="keel-inproc-")
        self.lock = threading.Lock()
        self.local = threading.local()
        self.runners: List[_Runner] = []
        self.problems: List[str] = []
        self.next_id = 0
        self.started = 0

    def run(self, argv: Sequence[str], cwd: str, env: Optional[Dict[str, str]] = None,
            unset: Sequence[str] = ()) -> Outcome:
        """keel argv[1:] with argv[0] as its program name, in cwd, with env set and unset names
        removed (on top of the pool's environment)."""
        with self.lock:
            self.next_id += 1
            case_id = self.next_id
        runner = getattr(self.local, "runner", None)
        if runner is None:
            with self.lock:
                self.started += 1
                runner = _Runner(self.exe, self.env, self.tmp.name, self.started,
                                 self.preexec_fn)
                self.runners.append(runner)
            self.local.runner = runner
        outcome, alive = runner.run(case_id, argv, cwd, env or {}, unset, self.timeout_s)
        if not alive:  # hung or ended by the case: the next case gets a fresh runner
            runner.close(self.timeout_s)
            self.local.runner = None
        return outcome

    def keel(self, argv: Sequence[str], cwd: str, env: Optional[Dict[str, str]] = None,
             unset: Sequence[str] = ()) -> Tuple[int, str, str]:
        """run() for a test that wants what a keel process gives: (exit status, stdout, stderr),
        the texts as subprocess's text=True reads them; raises AssertionError when keel hung or
        left process-global state changed."""
        o = self.run(argv, cwd, env, unset)
        shown = " ".join(argv[1:])
        if o.returncode is None:
            raise AssertionError(f"keel {shown} hung (killed after {self.timeout_s} s): "
                                 f"{o.stderr}")
        if o.leaks:
            raise AssertionError(f"keel {shown} left process-global state changed: {o.leaks}")
        return (o.returncode, *(t.replace("\r\n", "\n").replace("\r", "\n")
                                for t in (o.stdout, o.stderr)))

    def close(self) -> List[str]:
        """Ends every runner still running; returns their problems (empty: all exited 0)."""
        for r in self.runners:
            if r.proc.returncode is None:
                p = r.close(self.timeout_s)
                if p:
                    self.problems.append(p)
        self.tmp.cleanup()
        return self.problems


def normalized(text: str, d: Optional[str] = None, digits: bool = False) -> str:
    """Output without what differs between two runs of one case: its directory (as {d}), the
    console's [HH:MM:SS] times, process ids, and with digits=True every number (an integer and a
    decimal alike: a rate can print as 1200 in one run and 1187.5 in the next)."""
    if d:
        text = text.replace(d, "{d}")
    text = re.sub(r"\[\d\d:\d\d:\d\d\]", "[T]", text)
    text = re.sub(r"pid \d+", "pid N", text)
    if digits:
        text = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", text)
    return text
