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
- a screenshot is kept in the meson build directory (tests/report-screenshot.png).
The command's bad input (no run directory, no metrics.jsonl, a malformed metrics line) is in
tests/cli/test_bad_input.py.

Skips (exit 77) when /usr/bin/chromium is absent; setup.sh installs it.
Usage: test_report.py KEEL_BINARY SOURCE_ROOT BUILD_DIR
"""
import html
import json
import os
import re
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


if not os.path.exists(CHROMIUM):
    print("SKIP: /usr/bin/chromium is not installed (./setup.sh installs Debian's chromium)")
    sys.exit(77)


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
    for split in ("train", "test"):
        rows = [x for x in records if x.get("split") == split]
        keys = {k for x in rows for k, v in x.items() if isinstance(v, (int, float))}
        keys.discard("step")
        check(split == "test" or {"epoch", "samples"} <= keys, f"{split} counters: {keys}")
        for k in keys & counters:
            check(f"{split} {k}" not in series, f"the counter {split} {k} is charted")
        keys -= counters
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
    check(not any(c["title"] == "phases" for c in charts) and len(charts) >= 8,
          f"charts without a trace: {[c['title'] for c in charts]}")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
