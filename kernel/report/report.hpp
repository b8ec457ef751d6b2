// keel report RUN_DIR [--output FILE]: one self-contained HTML page about a run.
//
// Reads from RUN_DIR:
//   metrics.jsonl           required: the training and evaluation records (the jsonl sink's)
//   manifest.resolved.toml  shown as text when present
//   plugins.json            the plugins used, with versions (written since issue 11)
//   trace.json              the chrome_trace profiler's phases: mean ms per phase of a step
// and writes FILE (default RUN_DIR/report.html): charts over steps of every numeric metric
// (training and evaluation loss, accuracy or bits per token, learning rate, gradient norm,
// throughput, MFU, ...), the phase breakdown, the manifest and the plugins. The charts are drawn
// by uPlot (kernel/report/vendor/, embedded in keel and inlined into the page), so the page
// needs no network and no server. After drawing, the page writes what each chart plotted
// (series, points, last value) as JSON into <pre id="rendered"> and any script error into
// <pre id="errors">, which tests/test_report.py reads through headless Chromium.
#pragma once

#include <string>

namespace keel::report {

// Writes the report; returns the path written. Throws keel::Error (one line, with a hint) when
// RUN_DIR or its metrics.jsonl is missing, a metrics line is not a JSON object (naming
// file:line), or the output cannot be written.
std::string write_report(const std::string& run_dir, const std::string& output);

}  // namespace keel::report
