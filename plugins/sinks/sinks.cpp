// Metric sinks: hooks that act on KEEL_EVENT_METRICS. This file: the plugin's component table
// and jsonl; console.cpp and csv.cpp hold the others.
#include <nlohmann/json.hpp>

#include "format.hpp"
#include "sinks.hpp"

namespace {

using sinks::exact_value;

// A string as a JSON literal (nlohmann's escaping; bytes that are not UTF-8 become U+FFFD).
std::string json_string(const char* s) {
  return nlohmann::json(s ? s : "").dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// jsonl: one JSON object per METRICS event: {"split": "train", "step": 100, "loss": 0.51...}.
// Values are written like the csv sink writes them (counts as integers, the rest as the
// shortest text that reads back as the same double); NaN and infinities, which JSON cannot
// hold, as null.

// The step of a jsonl record, or -1 when the line is not one.
int64_t step_of_record(const std::string& line) {
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) return -1;
  return j["step"].get<int64_t>();
}

constexpr auto kAppend =
    keel::opt_bool("append", "false", "append to an existing file instead of starting it afresh");

class JsonLines : public keel::Hook {
 public:
  // A resumed run (ctx.resume_step() > 0) keeps the records up to the step it resumes from,
  // drops later ones (written after the checkpoint by the run that was interrupted), and
  // appends.
  explicit JsonLines(const keel::Context& ctx)
      : file_(sinks::output_path(ctx),
              ctx.get(kAppend) || sinks::keep_records_until(sinks::output_path(ctx),
                                                                  ctx.resume_step(),
                                                                  &step_of_record)) {}

  void on_event(keel_event& ev) override {
    if (ev.kind == KEEL_EVENT_TRAIN_END) file_.flush();
    if (ev.kind != KEEL_EVENT_METRICS) return;
    std::string line = "{\"split\": " + json_string(ev.split);
    for (size_t i = 0; i < ev.metric_count; ++i) {
      const keel_metric& m = ev.metrics[i];
      line += ", " + json_string(m.key) + ": ";
      line += std::isfinite(m.value) ? exact_value(m.key, m.value) : "null";
    }
    file_.write(line + "}\n");
  }

 private:
  sinks::OutputFile file_;
};

const keel_option_desc kJsonLinesOptions[] = {
    keel::opt_string("path", "\"metrics.jsonl\"",
                     "output file (relative paths: inside the run dir)"),
    kAppend,
    sinks::kEveryRank,
};

const keel_component_desc kComponents[] = {
    sinks::console_component(),
    keel::component<sinks::OnRank<JsonLines>>("jsonl", "metric records as one JSON object per line",
                                              kJsonLinesOptions),
    sinks::csv_component(),
};

}  // namespace

KEEL_PLUGIN("keel-sinks", "0.2.0", "Metric sinks: console log and progress bar, JSON lines, CSV",
            kComponents)
