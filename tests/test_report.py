"""keel report: a real short run (the quickstart with evaluation every 4 steps, the chrome_trace
profiler and a checkpoint), then `keel report`, opened in headless Chromium (Debian's
/usr/bin/chromium, from file://, no server):

- the page renders without a script error or any console message (the page collects window
  errors into #errors; Chromium's --enable-logging=stderr prints every console message as a
  CONSOLE line) and draws a chart of every numeric key of metrics.jsonl but the step: the
  series it plotted, with their point counts and last values, equal those of metrics.jsonl (the
  page writes them as JSON into #rendered after drawing);
- the phase breakdown's bars are the profiler's phases with their mean ms per recorded step,
  computed here from trace.json, and the plugins table holds the plugins.json entries (names and
  versions);
- the manifest is shown, escaped (a `</script>` in a manifest string cannot break the page);
- without plugins.json and trace.json (an older run, no profiler) the page, written with
  --output elsewhere, says that both are absent and still renders without errors;
- a screenshot is kept in the meson build directory (tests/report-screenshot.png).
The command's bad input (no run directory, no metrics.jsonl, a malformed metrics line) is in
tests/test_bad_input.py.

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
    for split in ("train", "test"):
        rows = [x for x in records if x.get("split") == split]
        keys = {k for x in rows for k, v in x.items() if isinstance(v, (int, float))}
        keys.discard("step")
        check(len(keys) >= (5 if split == "train" else 2), f"{split} keys: {keys}")
        for k in keys:
            label = f"{split} {k}"
            values = [x[k] for x in rows if isinstance(x.get(k), (int, float))]
            s = series.get(label)
            check(s is not None and s["points"] == len(values) and
                  abs(s["last"] - values[-1]) <= 1e-12 * max(1.0, abs(values[-1])),
                  f"chart series {label}: {s} vs {len(values)} points ending {values[-1]}")
    check(series.get("train loss", {}).get("points") == 6, "6 training records drawn")
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

    # An older run: no plugins.json, no profiler trace.
    os.remove(os.path.join(run, "plugins.json"))
    os.remove(os.path.join(run, "trace.json"))
    older = os.path.join(tmp, "older.html")
    r = subprocess.run([KEEL, "report", run, "--output", older], capture_output=True, text=True)
    check(r.returncode == 0 and os.path.exists(older), f"keel report --output: {r.stderr}")
    dom, charts = render(older)
    check("No plugins.json in the run directory" in dom, "the page says plugins.json is absent")
    check("No profiler trace" in dom, "the page says the trace is absent")
    check(not any(c["title"] == "phases" for c in charts) and len(charts) >= 8,
          f"charts without a trace: {[c['title'] for c in charts]}")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
