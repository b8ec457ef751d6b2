// keel report RUN_DIR [--output FILE]: one self-contained HTML page about a run.
//
// Reads from RUN_DIR, only its regular files, opened without following a symlink, whose directory
// resolves inside RUN_DIR (a handed run directory's names lead to no file of yours):
//   metrics.jsonl           required: the training and evaluation records (the jsonl hook's)
//   manifest.resolved.toml  shown as text when present
//   plugins.json            the plugins used, with versions (the page says when it is absent)
//   the profiler's trace    [profiler] path of the manifest, else trace.json: the chrome_trace
//                           profiler's phases, as the mean ms per phase of a recorded step (a
//                           path out of RUN_DIR is not read; the page says so)
//   run.log                 where the run stopped and why, and its wall time (summary.hpp)
//   eval-*/                 the run's `keel evaluate` runs: their checkpoints and records
// and writes FILE (default RUN_DIR/report.html) under a run directory's rules (files/owned_dir.hpp,
// OwnedDir::open and write_file: its directory yours and not writable by others unless sticky, a
// new temporary file renamed over FILE, never written through a symlink): a summary (summary.hpp: for the directory of
// an evaluation the checkpoint it evaluated; where and why the run stopped, steps, the last
// epoch, samples and tokens, wall time, throughput, the final and best value of each
// evaluation metric), a training run's evaluations (one row per eval-*/), charts over steps of
// every numeric metric but the counters that only climb and the training keys that repeat
// another in every record (tokens per second equal to samples per second: summary.hpp,
// same_as) (the known ones first: loss, accuracy, bits per character or token, learning rate,
// gradient norm, throughput, MFU, step time, evaluation and checkpoint time; then any other
// key), the phase breakdown, the plugins and the manifest. The charts are drawn by uPlot
// (tools/report/vendor/, embedded in keel and inlined into the page with its licence), so the
// page needs no network and no server. After drawing, the page writes what each chart plotted
// (series, points, last value; the phase chart's values too) as JSON into <pre id="rendered">
// and any script error into <pre id="errors">, which tests/cli/test_report.py reads through
// headless Chromium.
#pragma once

#include <string>

namespace keel::report {

// Writes the report; returns the path written. Throws keel::Error (one line, with a hint) when
// RUN_DIR or its metrics.jsonl is missing, a metrics line is not a JSON object with a numeric
// "step" (naming file:line), or the output cannot be written.
std::string write_report(const std::string& run_dir, const std::string& output);

}  // namespace keel::report
