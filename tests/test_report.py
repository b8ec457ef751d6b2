"""keel report: a real short run (the quickstart with evaluation every 4 steps, the chrome_trace
profiler and a checkpoint), then `keel report`, opened in headless Chromium (Debian's
/usr/bin/chromium, from file://, no server):

- the page renders without a script error (the page collects window errors into #errors) and
  draws a chart of every metric: the series it plotted, with their point counts and last values,
  equal those of metrics.jsonl (the page writes them as JSON into #rendered after drawing);
- the phase breakdown holds the profiler's phases, and the plugins table the plugins.json
  entries (names and versions);
- the manifest is shown, escaped (a `</script>` in a manifest string cannot break the page);
- a screenshot is kept in the meson build directory (tests/report-screenshot.png);
- bad input: a missing run directory, a run directory without metrics.jsonl and a malformed
  metrics line each fail with one line (the last names file:line).

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


if not os.path.exists(CHROMIUM):
    print("SKIP: /usr/bin/chromium is not installed (./setup.sh installs Debian's chromium)")
    sys.exit(77)


def chromium(*args):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--user-data-dir=" + profile, *args],
                          capture_output=True, text=True, timeout=120)


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
    dom = chromium("--virtual-time-budget=5000", "--dump-dom", "file://" + page)
    check(dom.returncode == 0, f"chromium --dump-dom: {dom.stderr[-800:]}")
    errors = re.search(r'<pre id="errors">(.*?)</pre>', dom.stdout, re.S)
    rendered = re.search(r'<pre id="rendered">(.*?)</pre>', dom.stdout, re.S)
    check(errors is not None and errors.group(1).strip() == "",
          f"script errors: {errors.group(1) if errors else 'no #errors element'}")
    check(rendered is not None and rendered.group(1).strip() != "", "the page reported no charts")
    charts = json.loads(html.unescape(rendered.group(1))) if rendered else []
    series = {s["label"]: s for c in charts for s in c["series"]}
    for split in ("train", "test"):
        rows = [x for x in records if x.get("split") == split]
        keys = {k for x in rows for k, v in x.items() if isinstance(v, (int, float))}
        keys -= {"step", "epoch", "samples", "tokens", "loss_last", "grad_norm_last"}
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
    phases = {e["name"] for e in trace["traceEvents"] if e["pid"] == 0}
    check(series.get("ms", {}).get("points") == len(phases) and len(phases) >= 5,
          f"phase bars: {series.get('ms')} for {phases}")
    plugins = json.load(open(os.path.join(run, "plugins.json")))["plugins"]
    for p in plugins:
        check(f"<td>{p['name']}</td><td>{p['version']}</td>" in dom.stdout,
              f"plugins table row for {p['name']}")
    check("&lt;/script&gt;&lt;b&gt;x" in dom.stdout, "the manifest is shown, escaped")

    shot = os.path.join(BUILD, "tests", "report-screenshot.png")
    os.makedirs(os.path.dirname(shot), exist_ok=True)
    s = chromium("--virtual-time-budget=5000", "--window-size=1280,2400", "--screenshot=" + shot,
                 "file://" + page)
    check(s.returncode == 0 and os.path.getsize(shot) > 20000, f"screenshot: {s.stderr[-500:]}")
    print("screenshot:", shot)

    # Bad input: one line each, non-zero exit.
    for args, want in [
            ([os.path.join(tmp, "nope")], "is not a directory"),
            ([tmp], "metrics.jsonl does not exist"),
    ]:
        r = subprocess.run([KEEL, "report", *args], capture_output=True, text=True)
        check(r.returncode != 0 and want in r.stderr and len(r.stderr.strip().splitlines()) == 1,
              f"report {args}: {r.returncode} {r.stderr}")
    bad = os.path.join(tmp, "bad")
    os.makedirs(bad)
    open(os.path.join(bad, "metrics.jsonl"), "w").write('{"step": 1, "loss": 2}\n{"step": \n')
    r = subprocess.run([KEEL, "report", bad], capture_output=True, text=True)
    check(r.returncode != 0 and "metrics.jsonl:2: not a metrics record" in r.stderr and
          len(r.stderr.strip().splitlines()) == 1, f"malformed line: {r.stderr}")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
