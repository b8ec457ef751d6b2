// The summary at the top of `keel report`'s page (report.hpp): where the run stopped and why,
// its steps and counters, wall time, throughput, and the final and best value of each
// evaluation metric.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace keel::report {

// The summary of a run, from its metrics records (`train`, `test`: arrays of metrics.jsonl
// objects, in file order) and its run.log text ("" when absent):
//   {"step": the last step of any record (null without records),
//    "counters": {"epoch": ..., "samples": ..., "tokens": ...}  the last training record's,
//    "stop": {"step": N, "reason": "..."}  from run.log's last line whose message starts
//            "run finished at step N: " (the loop logs one per run), else {"step": the last
//            step, "reason": "unknown"},
//    "wall_time_s": the time run.log's sessions (each from its "===== keel" line) spent
//                   between their earliest and latest timestamped lines, added up (null
//                   without run.log), "sessions": how many,
//    "throughput": {"samples_per_s": ..., "tokens_per_s": ...}  means over the training
//                  records that have them (a key is absent when none has it),
//    "eval": [{"metric", "final", "final_step", "best", "best_step"}]  per numeric key of the
//            evaluation records but step and the counters, in order of first appearance;
//            "best" is the lowest for losses, bits and perplexities, the highest for
//            accuracies (null for a key of unknown direction)}
nlohmann::ordered_json run_summary(const nlohmann::ordered_json& train,
                                   const nlohmann::ordered_json& test,
                                   const std::string& run_log);

// The summary as HTML: <table id="summary"> (stop, steps, counters, wall time, throughput) and
// <table id="eval-summary"> (the evaluation metrics; a sentence instead when there are none).
// Numbers are printed with printf's %.6g.
std::string summary_html(const nlohmann::ordered_json& summary);

// The keys that only climb: epoch, samples, tokens. The page keeps them in its data and the
// summary, and charts none of them.
const std::vector<std::string>& counter_keys();
bool is_counter(const std::string& key);

}  // namespace keel::report
