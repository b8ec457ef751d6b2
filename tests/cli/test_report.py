"""keel report: a real short run (the quickstart with evaluation every 4 steps, the chrome_trace
profiler and a checkpoint), then `keel report`, opened in headless Chromium (Debian's
/usr/bin/chromium, from file://, no server):

- the page renders without a script error or any console message (the page collects window
  errors into #errors; Chromium's --enable-logging=stderr prints every console message as a
  CONSOLE line) and draws a chart of every numeric key of metrics.jsonl but the step and the
  counters that only climb (epoch, samples, tokens), which it does not chart: the series it
  plotted, with their point counts and last values, equal those of metrics.jsonl (the page
  writes them as JSON into #rendered after drawing);
- the summary at the top gives where the run stopped and why (run.log's "run finished at step
  N: <reason>" line, "unknown" without one), the steps, the last counters, the wall time, the
  mean throughput, and each evaluation metric's final and best value with their steps, all as
  metrics.jsonl and run.log say;
- the phase breakdown's bars are the profiler's phases with their mean ms per recorded step,
  computed here from trace.json, and the plugins table holds the plugins.json entries (names and
  versions);
- the manifest is shown, escaped (a `</script>` in a manifest string cannot break the page);
- without plugins.json and trace.json (an older run, no profiler) the page, written with
  --output elsewhere, says that both are absent and still renders without errors;
- a screenshot is kept in the meson build directory (tests/report-screenshot.png);
- first, without a browser, on run directories written here, the page's data: the wall time of
  a run.log appended across an --overwrite counts the last run's sessions only, the run's
  eval-*/ evaluations are listed with their checkpoints, an evaluation's page names its
  checkpoint, and tokens equal to samples are neither summarised nor charted (these run and
  count without Chromium too).
The command's bad input (no run directory, no metrics.jsonl, a malformed metrics line) is in
tests/cli/test_bad_input.py.

Skips (exit 77) when /usr/bin/chromium is absent; setup.sh installs it.
Usage: test_report.py KEEL_BINARY SOURCE_ROOT BUILD_DIR
"""
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

KEEL, ROOT, BUILD = sys.argv[1], sys.argv[2], sys.argv[3]
CHROMIUM = "/usr/bin/chromium"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def page_data(page):
    """The data the page is drawn from (its <script id="data">: the summary, the records, the
    evaluations), read without a browser."""
    with open(page) as f:
        m = re.search(r'<script type="application/json" id="data">(.*?)</script>', f.read(), re.S)
    check(m is not None, f"{page}: no data element")
    return json.loads(m.group(1)) if m else {}


def report(run_dir):
    """keel report RUN_DIR; returns the page's HTML and its data."""
    r = subprocess.run([KEEL, "report", run_dir], capture_output=True, text=True)
    page = os.path.join(run_dir, "report.html")
    check(r.returncode == 0 and os.path.exists(page), f"keel report {run_dir}: {r.stderr}")
    if r.returncode != 0:
        return "", {}
    with open(page) as f:
        return f.read(), page_data(page)


def write_run(d, records, log="", manifest=""):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    if log:
        with open(os.path.join(d, "run.log"), "w") as f:
            f.write(log)
    if manifest:
        with open(os.path.join(d, "manifest.resolved.toml"), "w") as f:
            f.write(manifest)


# The summary data without a browser, on written run directories (issue 42, point 9):
# - run.log appended across an --overwrite: the wall time counts the sessions of the run the
#   records are of (the trailing ones sharing the last session's run id: a --resume keeps it),
#   not the replaced run's, and says how many it left out; the stop reason is the run's own;
# - tokens equal to samples in every record (the MLP's images): no tokens/s in the summary or
#   the charts' data (same_as), and no tokens counter; distinct tokens keep both;
# - the run's `keel evaluate` runs (eval-*/) are listed with the checkpoint each evaluated and
#   its record; an evaluation's own report names its checkpoint (point 8).
with tempfile.TemporaryDirectory() as tmp:
    run = os.path.join(tmp, "run")
    log = ("===== keel train, run aaaa1111, 2026-01-01 00:00:00 UTC, pid 1 =====\n"
           "[2026-01-01 00:00:00.000] [info] start\n"
           "[2026-01-01 00:01:40.000] [info] run finished at step 90: max_steps reached\n"
           "\n===== keel train, run bbbb2222, 2026-01-01 01:00:00 UTC, pid 2 =====\n"
           "[2026-01-01 01:00:00.000] [info] start\n"
           "[2026-01-01 01:00:10.000] [info] stopped by SIGINT\n"
           "\n===== keel train, run bbbb2222, 2026-01-01 02:00:00 UTC, pid 3 =====\n"
           "[2026-01-01 02:00:00.000] [info] start\n"
           "[2026-01-01 02:00:05.500] [info] run finished at step 8: max_steps reached\n")
    same = [{"split": "train", "step": s, "epoch": 0, "samples": 64 * s, "tokens": 64 * s,
             "loss": 1.0 / s, "samples_per_s": 100.0 + s, "tokens_per_s": 100.0 + s}
            for s in (4, 8)]
    # A second evaluation set ([data.eval.valid]): named on the page, not mixed into "test".
    write_run(run, same + [{"split": "test", "step": 8, "epoch": 0, "loss": 0.5,
                            "accuracy": 0.75, "samples": 100},
                           {"split": "valid", "step": 8, "epoch": 0, "loss": 9.0,
                            "accuracy": 0.1, "samples": 50}], log)
    for name, step, acc in (("eval-20260101T030000Z", 8, 0.75), ("eval-20260101T030000Z-1", 4, 0.5)):
        write_run(os.path.join(run, name),
                  [{"split": "test", "step": step, "epoch": 0, "loss": 1 - acc, "accuracy": acc,
                    "samples": 100}],
                  "===== keel evaluate, run cccc3333, 2026-01-01 03:00:00 UTC, pid 4 =====\n",
                  f'[run]\nmode = "evaluate"\n[checkpoint]\ninit_from = "{run}/checkpoints/step-{step}"\n')
    dom, data = report(run)
    check([r["loss"] for r in data.get("test", [])] == [0.5], f"test records: {data.get('test')}")
    check("The records of the other evaluation sets (valid) are in metrics.jsonl, not charted "
          "here." in dom, "the page names the evaluation sets it does not chart")
    s = data.get("summary", {})
    check(s.get("wall_time_s") == 15.5 and s.get("sessions") == 2 and s.get("earlier_sessions") == 1,
          f"wall time of the last run only: {s}")
    check(s.get("stop") == {"step": 8, "reason": "max_steps reached"}, f"stop: {s.get('stop')}")
    check("15.5 s (run.log, 2 sessions; not counted: 1 session of earlier runs" in dom,
          "the page says what it left out of the wall time")
    check(data.get("same_as") == {"tokens": "samples", "tokens_per_s": "samples_per_s"},
          f"same_as: {data.get('same_as')}")
    check(s.get("throughput") == {"samples_per_s": 106.0}, f"throughput: {s.get('throughput')}")
    check(set(s.get("counters", {})) == {"epoch", "samples"}, f"counters: {s.get('counters')}")
    check("tokens/s" not in dom, "no tokens/s on the page of a run whose tokens are its samples")
    check(data.get("evaluations") == [
        {"dir": "eval-20260101T030000Z", "checkpoint": f"{run}/checkpoints/step-8", "step": 8,
         "metrics": {"loss": 0.25, "accuracy": 0.75}},
        {"dir": "eval-20260101T030000Z-1", "checkpoint": f"{run}/checkpoints/step-4", "step": 4,
         "metrics": {"loss": 0.5, "accuracy": 0.5}}], f"evaluations: {data.get('evaluations')}")
    check('<table id="evaluations">' in dom and
          f"<td>eval-20260101T030000Z-1</td><td><code>{run}/checkpoints/step-4</code></td><td>4</td>"
          in dom, "the evaluations table")
    check("checkpoint" not in s, "a training run's summary names no evaluated checkpoint")
    # An evaluation's own report: the checkpoint it evaluated, and no evaluations table.
    dom, data = report(os.path.join(run, "eval-20260101T030000Z"))
    s = data.get("summary", {})
    check(s.get("checkpoint") == {"path": f"{run}/checkpoints/step-8", "step": 8},
          f"evaluated checkpoint: {s.get('checkpoint')}")
    check(f"<tr><th>evaluated checkpoint</th><td><code>{run}/checkpoints/step-8</code> (step 8)"
          in dom and '<table id="evaluations">' not in dom, "the evaluation's page")
    # Tokens of their own (a language model): kept; no eval-*/: said.
    shutil.rmtree(run)
    write_run(run, [dict(r, tokens=r["tokens"] * 256, tokens_per_s=r["tokens_per_s"] * 256)
                    for r in same])
    dom, data = report(run)
    s = data.get("summary", {})
    check(data.get("same_as") == {} and set(s.get("throughput", {})) == {"samples_per_s", "tokens_per_s"}
          and "tokens" in s.get("counters", {}), f"distinct tokens kept: {s}")
    check("No <code>keel evaluate</code> of this run" in dom, "the page says there are none")

# A handed run directory (issue 43, finding 1's report part) and the page written through
# another user's names (finding 7), without a browser:
# - its manifest's [profiler] path naming a trace outside it (absolute, or through ".."), and
#   run.log, manifest.resolved.toml and plugins.json as symlinks to a private file: none of
#   those files is read into the page (their marker strings never appear), and the page says
#   that the trace is outside the run directory;
# - a symlink planted as <output>.tmp (the temporary name keel report used) and one planted as
#   the output itself: the files they point to stay as they were; the output is a new regular
#   file (the planted symlink replaced, not followed);
# - an output directory others can write (0777, no sticky bit) is one error line, nothing
#   written; a sticky one (0777 plus the sticky bit, like /tmp) is written.
with tempfile.TemporaryDirectory() as tmp:
    private = os.path.join(tmp, "private.txt")
    with open(private, "w") as f:
        f.write("PRIVATE-MARKER-1234\n")
    trace = {"traceEvents": [{"pid": 0, "ph": "X", "name": "SECRET_PHASE", "dur": 5, "ts": 0,
                              "args": {"step": 1}}]}
    outside = os.path.join(tmp, "outside.json")
    with open(outside, "w") as f:
        json.dump(trace, f)
    rec = [{"split": "train", "step": 1, "loss": 1.0}]
    for name, path in (("absolute", outside), ("dotdot", "../outside.json")):
        run = os.path.join(tmp, "handed-" + name)
        write_run(run, rec, manifest=f'[profiler]\ntype = "chrome_trace"\npath = "{path}"\n')
        dom, data = report(run)
        check("SECRET_PHASE" not in dom and data.get("phases") is None,
              f"{name}: the trace out of the run directory is not read: {data.get('phases')}")
        check("is outside the run directory" in dom, f"{name}: the page says why")
    run = os.path.join(tmp, "linked")
    write_run(run, rec)
    for name in ("run.log", "manifest.resolved.toml", "plugins.json"):
        os.symlink(private, os.path.join(run, name))
    dom, data = report(run)
    check(dom and "PRIVATE-MARKER" not in dom, "files symlinked out of the run directory are not read")
    # --output through planted symlinks.
    victim = os.path.join(tmp, "victim.txt")
    for planted in ("page.html.tmp", "page.html"):
        out_dir = os.path.join(tmp, "out-" + planted.replace(".", "-"))
        os.makedirs(out_dir)
        with open(victim, "w") as f:
            f.write("victim's file\n")
        os.symlink(victim, os.path.join(out_dir, planted))
        out = os.path.join(out_dir, "page.html")
        r = subprocess.run([KEEL, "report", run, "--output", out], capture_output=True, text=True)
        with open(victim) as f:
            check(f.read() == "victim's file\n", f"{planted} planted as a symlink: written through")
        check(r.returncode == 0 and not os.path.islink(out) and os.path.isfile(out),
              f"{planted} planted: the page is a new file: {r.returncode} {r.stderr}")
    for mode, ok in ((0o777, False), (0o1777, True)):
        shared = os.path.join(tmp, f"shared-{mode:o}")
        os.makedirs(shared)
        os.chmod(shared, mode)
        out = os.path.join(shared, "page.html")
        r = subprocess.run([KEEL, "report", run, "--output", out], capture_output=True, text=True)
        lines = r.stderr.strip().splitlines()
        if ok:
            check(r.returncode == 0 and os.path.isfile(out), f"sticky {mode:o}: {r.stderr}")
        else:
            check(r.returncode == 1 and len(lines) == 1 and "is writable by every user" in lines[0]
                  and "hint: give --output" in lines[0] and os.listdir(shared) == [],
                  f"an output directory others can write: one line, nothing written: {r.stderr}")

if not os.path.exists(CHROMIUM):
    print("SKIP: /usr/bin/chromium is not installed (./setup.sh installs Debian's chromium); "
          f"the checks without it: {len(failures)} failure(s)")
    sys.exit(1 if failures else 77)


def chromium(*args):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--user-data-dir=" + profile, *args],
                          capture_output=True, text=True, timeout=120)


def g(v):
    """A number as the page prints it (printf's %.6g)."""
    return f"{v:.6g}"


def summary_of(dom):
    """The summary table's rows (th -> td) and the evaluation table's rows (metric -> cells)."""
    table = re.search(r'<table id="summary">(.*?)</table>', dom, re.S)
    rows = dict(re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", table.group(1))) if table else {}
    table = re.search(r'<table id="eval-summary">(.*?)</table>', dom, re.S)
    evals = {}
    for cells in re.findall(r"<tr><td>(.*?)</td></tr>", table.group(1) if table else ""):
        cells = cells.split("</td><td>")
        evals[cells[0]] = cells[1:]
    return rows, evals


def render(page):
    """Checks that the page logs nothing to the console and that its #errors is empty; returns
    its DOM after its scripts ran and its #rendered, parsed."""
    dom = chromium("--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
                   "--dump-dom", "file://" + page)
    check(dom.returncode == 0, f"chromium --dump-dom {page}: {dom.stderr[-800:]}")
    console = [l for l in dom.stderr.splitlines() if ":CONSOLE" in l]
    check(console == [], f"console messages of {page}: {console}")
    errors = re.search(r'<pre id="errors">(.*?)</pre>', dom.stdout, re.S)
    rendered = re.search(r'<pre id="rendered">(.*?)</pre>', dom.stdout, re.S)
    check(errors is not None and errors.group(1).strip() == "",
          f"script errors: {errors.group(1) if errors else 'no #errors element'}")
    check(rendered is not None and rendered.group(1).strip() != "", "the page reported no charts")
    charts = json.loads(html.unescape(rendered.group(1))) if rendered else []
    return dom.stdout, charts


with tempfile.TemporaryDirectory() as tmp:
    profile = os.path.join(tmp, "chromium-profile")
    run = os.path.join(tmp, "run")
    r = subprocess.run([KEEL, "train", os.path.join(ROOT, "configs", "quickstart.toml"),
                        "--set", "train.epochs=0", "--set", "train.max_steps=24",
                        "--set", "train.log_every=4", "--set", "train.eval_every_steps=8",
                        "--set", "data.test.limit=500",
                        "--set", 'run.name="</script><b>x"',
                        "--set", 'profiler.type="chrome_trace"', "--set", "profiler.start_step=3",
                        "--set", "profiler.end_step=6", "--set", f'run.output_dir="{run}"'],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"keel train: {r.stderr[-1500:]}")
    r = subprocess.run([KEEL, "report", run], capture_output=True, text=True)
    page = os.path.join(run, "report.html")
    check(r.returncode == 0 and os.path.exists(page), f"keel report: {r.stdout} {r.stderr}")

    records = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    dom, charts = render(page)
    series = {s["label"]: s for c in charts for s in c["series"]}
    counters = {"epoch", "samples", "tokens"}
    # The MLP's dataset counts a sample as a token: tokens/s repeats samples/s, charted once.
    check(page_data(page).get("same_as", {}).get("tokens_per_s") == "samples_per_s" and
          "train tokens_per_s" not in series and "train samples_per_s" in series,
          f"tokens/s equal to samples/s charted once: {sorted(series)}")
    for split in ("train", "test"):
        rows = [x for x in records if x.get("split") == split]
        keys = {k for x in rows for k, v in x.items() if isinstance(v, (int, float))}
        keys.discard("step")
        check(split == "test" or {"epoch", "samples"} <= keys, f"{split} counters: {keys}")
        for k in keys & counters:
            check(f"{split} {k}" not in series, f"the counter {split} {k} is charted")
        keys -= counters | ({"tokens_per_s"} if split == "train" else set())
        check(len(keys) >= (5 if split == "train" else 2), f"{split} keys: {keys}")
        for k in keys:
            label = f"{split} {k}"
            values = [x[k] for x in rows if isinstance(x.get(k), (int, float))]
            s = series.get(label)
            check(s is not None and s["points"] == len(values) and
                  abs(s["last"] - values[-1]) <= 1e-12 * max(1.0, abs(values[-1])),
                  f"chart series {label}: {s} vs {len(values)} points ending {values[-1]}")
    check(series.get("train loss", {}).get("points") == 6, "6 training records drawn")

    # The summary, against metrics.jsonl and run.log.
    rows, evals = summary_of(dom)
    train_rows = [x for x in records if x.get("split") == "train"]
    test_rows = [x for x in records if x.get("split") == "test"]
    log = open(os.path.join(run, "run.log")).read()
    finished = re.findall(r"\] run finished at step (\d+): (.*)", log)
    reason = f"at step {finished[-1][0]}: {html.escape(finished[-1][1], quote=False)}" \
        if finished else "at step 24: unknown"
    check(rows.get("stopped") == reason, f"summary stopped: {rows.get('stopped')} vs {reason}")
    check(rows.get("steps") == "24", f"summary steps: {rows}")
    for k in ("epoch", "samples"):
        check(rows.get(k) == g(train_rows[-1][k]), f"summary {k}: {rows.get(k)}")
    wall = re.fullmatch(r"(\S+) s \(run\.log, 1 session\)", rows.get("wall time", ""))
    check(wall is not None and 0 < float(wall.group(1)) < 600, f"summary wall time: {rows}")
    rate = sum(x["samples_per_s"] for x in train_rows) / len(train_rows)
    check(rows.get("throughput", "").startswith(f"{g(rate)} samples/s"),
          f"summary throughput: {rows.get('throughput')} vs {g(rate)}")
    for key, best in (("loss", min), ("accuracy", max)):
        values = [(x[key], x["step"]) for x in test_rows]
        b = best(values, key=lambda v: v[0])
        want = [g(values[-1][0]), g(values[-1][1]), g(b[0]), g(b[1])]
        check(evals.get(key) == want, f"summary of test {key}: {evals.get(key)} vs {want}")
    check(not counters & set(evals), f"counters among the evaluation metrics: {evals}")
    check(series.get("test accuracy", {}).get("points") == 3, "3 evaluations drawn")
    trace = json.load(open(os.path.join(run, "trace.json")))
    totals, steps = {}, set()
    for e in trace["traceEvents"]:
        if e["pid"] == 0 and e["ph"] == "X":
            totals[e["name"]] = totals.get(e["name"], 0.0) + e["dur"]
            steps.add(e["args"]["step"])
    want = {name: us / len(steps) / 1e3 for name, us in totals.items()}
    bars = [c for c in charts if c["title"] == "phases"]
    got = dict(zip(bars[0]["phases"], bars[0]["values"])) if bars else {}
    check(len(want) >= 5 and steps == {3, 4, 5, 6} and got.keys() == want.keys() and
          all(abs(got[k] - want[k]) <= 1e-9 * max(1.0, want[k]) for k in want),
          f"phase bars {got} vs the trace's {want} over steps {steps}")
    plugins = json.load(open(os.path.join(run, "plugins.json")))["plugins"]
    check(len(plugins) >= 5, f"plugins.json: {plugins}")
    for p in plugins:
        check(f"<td>{p['name']}</td><td>{p['version']}</td>" in dom,
              f"plugins table row for {p['name']}")
    check("&lt;/script&gt;&lt;b&gt;x" in dom, "the manifest is shown, escaped")

    shot = os.path.join(BUILD, "tests", "report-screenshot.png")
    os.makedirs(os.path.dirname(shot), exist_ok=True)
    s = chromium("--virtual-time-budget=5000", "--window-size=1280,4400", "--screenshot=" + shot,
                 "file://" + page)
    check(s.returncode == 0 and os.path.getsize(shot) > 20000, f"screenshot: {s.stderr[-500:]}")
    print("screenshot:", shot)

    # An older run: no plugins.json, no profiler trace. And a run.log that says why it
    # finished (the last such line counts).
    os.remove(os.path.join(run, "plugins.json"))
    os.remove(os.path.join(run, "trace.json"))
    with open(os.path.join(run, "run.log"), "a") as f:
        f.write("[2026-01-01 00:00:00.000] [info] run finished at step 7: a <test> reason\n")
    older = os.path.join(tmp, "older.html")
    r = subprocess.run([KEEL, "report", run, "--output", older], capture_output=True, text=True)
    check(r.returncode == 0 and os.path.exists(older), f"keel report --output: {r.stderr}")
    dom, charts = render(older)
    check("No plugins.json in the run directory" in dom, "the page says plugins.json is absent")
    check("No profiler trace" in dom, "the page says the trace is absent")
    rows, _ = summary_of(dom)
    check(rows.get("stopped") == "at step 7: a &lt;test&gt; reason",
          f"summary stopped from run.log: {rows.get('stopped')}")
    check(not any(c["title"] == "phases" for c in charts) and len(charts) >= 7,
          f"charts without a trace: {[c['title'] for c in charts]}")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
