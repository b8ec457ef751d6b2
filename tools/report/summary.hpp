// The summary at the top of `keel report`'s page (report.hpp): where the run stopped and why,
// its steps and counters, wall time, throughput, and the final and best value of each
// evaluation metric.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace keel::report {

// The keys of the training records that repeat another key in every record that has either
// ({"tokens": "samples", "tokens_per_s": "samples_per_s"} for a dataset without tokens of its
// own, which counts a sample as a token): the summary leaves them out and the page does not
// chart them.
nlohmann::ordered_json same_as(const nlohmann::ordered_json& train);

// The summary of a run, from its metrics records (`train`, `test`: arrays of metrics.jsonl
// objects, in file order), its run.log text ("" when absent) and, for the directory of a
// `keel evaluate`, the checkpoint it evaluated ([checkpoint] init_from of its resolved
// manifest; "" for a training run):
//   {"step": the last step of any record (null without records),
//    "counters": {"epoch": ..., "samples": ..., "tokens": ...}  the last training record's
//                (but those same_as names),
//    "checkpoint": {"path": ..., "step": the evaluation record's}  (an evaluation only),
//    "stop": {"step": N, "reason": "..."}  from the counted sessions' last line whose message
//            starts "run finished at step N: " (the loop logs one per run), else {"step": the
//            last step, "reason": "unknown"},
//    "wall_time_s": the time run.log's sessions of the run (each from its "===== keel ..., run
//                   <id>, ..." line: the trailing sessions with the last one's run id, which a
//                   --resume keeps and a new run, --overwrite included, does not) spent between
//                   their earliest and latest timestamped lines, added up (null without
//                   run.log), "sessions": how many, "earlier_sessions": how many sessions of
//                   earlier runs run.log holds before them (not counted),
//    "throughput": {"samples_per_s": ..., "tokens_per_s": ...}  means over the training
//                  records that have them (a key is absent when none has it, or same_as
//                  names it),
//    "eval": [{"metric", "final", "final_step", "best", "best_step"}]  per numeric key of the
//            evaluation records but step and the counters, in order of first appearance;
//            "best" is the lowest for losses, bits and perplexities, the highest for
//            accuracies (null for a key of unknown direction)}
nlohmann::ordered_json run_summary(const nlohmann::ordered_json& train,
                                   const nlohmann::ordered_json& test,
                                   const std::string& run_log,
                                   const std::string& evaluated_checkpoint = "");

// The summary as HTML: <table id="summary"> (the evaluated checkpoint, stop, steps, counters,
// wall time, throughput) and <table id="eval-summary"> (the evaluation metrics; a sentence
// instead when there are none). Numbers are printed with printf's %.6g.
std::string summary_html(const nlohmann::ordered_json& summary);

// The run's `keel evaluate` runs, from its eval-*/ directories (report.cpp reads them), as
// <table id="evaluations">: one row per evaluation, {"dir": "eval-<time>", "checkpoint": its
// [checkpoint] init_from, "step": its record's, "metrics": {key: value} of its last evaluation
// record but step and the counters}, a column per metric; a sentence when there are none.
std::string evaluations_html(const nlohmann::ordered_json& evaluations);

// The keys that only climb: epoch, samples, tokens. The page keeps them in its data and the
// summary, and charts none of them.
const std::vector<std::string>& counter_keys();
bool is_counter(const std::string& key);

}  // namespace keel::report
