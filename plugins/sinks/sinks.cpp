// Metric sinks: hooks that act on KEEL_EVENT_METRICS (console log lines, a JSON-lines file).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "keel/plugin.hpp"

namespace {

// Keys whose values are counts: written as integers.
bool is_integer_key(const char* key) {
  return std::strcmp(key, "step") == 0 || std::strcmp(key, "epoch") == 0 ||
         std::strcmp(key, "samples") == 0 || std::strcmp(key, "tokens") == 0;
}

// Console: 4 significant digits, but large values (samples/s, tokens/s) in full.
std::string short_number(double v) {
  char buf[64];
  const bool large = std::fabs(v) >= 1e4 && std::fabs(v) < 1e15;
  std::snprintf(buf, sizeof buf, large ? "%.0f" : "%.4g", v);
  return buf;
}

// JSON: the shortest of %.15g..%.17g that reads back as the same double.
std::string exact_number(double v) {
  char buf[64];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string integer(double v) { return std::to_string(std::llround(v)); }

// "step 100/1875 epoch 0 loss 0.5123 ..." for train, "eval test step 1875: loss 0.41 ..." else.
class Console : public keel::Hook {
 public:
  explicit Console(const keel::Context& ctx)
      : host_(&ctx.host()), origin_(ctx.section()), every_(ctx.get_int("every")) {}

  void on_event(keel_event& ev) override {
    if (ev.kind != KEEL_EVENT_METRICS || ev.split == nullptr) return;
    const bool train = std::strcmp(ev.split, "train") == 0;
    if (train && records_++ % every_ != 0) return;

    const int64_t step = ev.state ? ev.state->step : 0;
    std::string line;
    if (train) {
      line = "step " + std::to_string(step);
      if (ev.state && ev.state->max_steps > 0) line += "/" + std::to_string(ev.state->max_steps);
    } else {
      line = "eval " + std::string(ev.split) + " step " + std::to_string(step) + ":";
    }
    for (size_t i = 0; i < ev.metric_count; ++i) {
      const keel_metric& m = ev.metrics[i];
      if (std::strcmp(m.key, "step") == 0) continue;  // already in the prefix
      line += " ";
      line += m.key;
      line += " ";
      line += is_integer_key(m.key) && std::isfinite(m.value) ? integer(m.value)
                                                              : short_number(m.value);
    }
    host_->log(KEEL_LOG_INFO, origin_.c_str(), line.c_str());
  }

 private:
  const keel_host* host_;
  std::string origin_;
  int64_t every_;
  int64_t records_ = 0;
};

std::string json_string(const char* s) {
  std::string out = "\"";
  for (; *s; ++s) {
    const unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// One JSON object per METRICS event: {"split": "train", "step": 100, "loss": 0.51..., ...}.
class JsonLines : public keel::Hook {
 public:
  explicit JsonLines(const keel::Context& ctx) : path_(ctx.get_string("path")) {
    if (!path_.empty() && path_[0] != '/') path_ = ctx.run_dir() + "/" + path_;
    file_ = std::fopen(path_.c_str(), ctx.get_bool("append") ? "a" : "w");
    if (file_ == nullptr)
      throw std::runtime_error("cannot open '" + path_ +
                               "' for writing; check that its directory exists and is writable");
  }
  ~JsonLines() override { std::fclose(file_); }
  JsonLines(const JsonLines&) = delete;
  JsonLines& operator=(const JsonLines&) = delete;

  void on_event(keel_event& ev) override {
    if (ev.kind == KEEL_EVENT_TRAIN_END) {
      if (std::fflush(file_) != 0 || std::ferror(file_))
        throw std::runtime_error("writing '" + path_ + "' failed (disk full?)");
      return;
    }
    if (ev.kind != KEEL_EVENT_METRICS) return;
    std::string line = "{\"split\": " + json_string(ev.split ? ev.split : "");
    for (size_t i = 0; i < ev.metric_count; ++i) {
      const keel_metric& m = ev.metrics[i];
      line += ", " + json_string(m.key) + ": ";
      if (!std::isfinite(m.value))
        line += "null";
      else
        line += is_integer_key(m.key) ? integer(m.value) : exact_number(m.value);
    }
    line += "}\n";
    std::fputs(line.c_str(), file_);
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

const keel_option_desc kConsoleOptions[] = {
    keel::opt_int("every", "1",
                  "print every Nth train record, from the first (eval records always)", 1, 1e12),
};
const keel_option_desc kJsonLinesOptions[] = {
    keel::opt_string("path", "\"metrics.jsonl\"",
                     "output file (relative paths: inside the run dir)"),
    keel::opt_bool("append", "false",
                   "append to an existing file instead of starting it afresh"),
};
const keel_component_desc kComponents[] = {
    keel::component<Console>("console", "metric records as compact log lines", kConsoleOptions),
    keel::component<JsonLines>("jsonl", "metric records as one JSON object per line",
                               kJsonLinesOptions),
};

}  // namespace

KEEL_PLUGIN("keel-sinks", "0.1.0", "Metric sinks: console log and JSON lines", kComponents)
