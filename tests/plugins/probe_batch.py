"""One `PROBE --batch` process (tests/plugins/probe.hpp), shared by the tests that drive a probe:
test_gpt, test_lm_losses, test_tokens and test_torch_profiler."""
import json
import subprocess


class Batch:
    """run(*args) sends one case, the arguments of a one-case command line, and returns (its
    output, None), or (None, its error message without surrounding whitespace) when it failed;
    the process goes on with the next case."""

    def __init__(self, *argv):
        self.argv = [*argv, "--batch"]
        self.p = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        self.cases = 0

    def run(self, *args):
        args = [str(a) for a in args]
        assert not any("\t" in a or "\n" in a for a in args), args
        self.p.stdin.write("\t".join(args) + "\n")
        self.p.stdin.flush()
        reply = self.p.stdout.readline()
        if not reply:
            raise RuntimeError(f"{self.argv} ended (status {self.p.wait()}) in case {args}")
        self.cases += 1
        r = json.loads(reply)
        return (r["output"], None) if r["ok"] else (None, r["error"].strip())

    def close(self):
        """The process's exit status, once it has read the end of its input."""
        self.p.stdin.close()
        return self.p.wait()
