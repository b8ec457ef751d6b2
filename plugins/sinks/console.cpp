// console: metric records as compact log lines ("step 100/1875 epoch 0 loss 0.5123 ...",
// "eval test step 1875: loss 0.41 ..."), and, on a terminal, a live progress bar below them.
#include <unistd.h>

#include <chrono>

#include "format.hpp"
#include "progress.hpp"
#include "sinks.hpp"

namespace sinks {
namespace {

using Clock = std::chrono::steady_clock;

// The bar on stdout, redrawn on STEP_END at most every 0.1 s. A frame is "\r\033[K" + text +
// "\r": the cursor stays in column 0, so a log line from elsewhere overwrites the bar instead
// of being glued to its end. above() clears the bar, prints a line and redraws the bar.
class LiveBar {
 public:
  LiveBar(bool enabled, std::string prefix) : enabled_(enabled), prefix_(std::move(prefix)) {}

  void start(const keel_trainer_state* s) {
    start_time_ = last_draw_ = Clock::now();
    start_step_ = s ? s->step : 0;
  }
  void update(const keel_trainer_state* s) {
    if (!enabled_ || s == nullptr) return;
    const auto now = Clock::now();
    if (shown_ && now - last_draw_ < std::chrono::milliseconds(100) && s->step != s->max_steps)
      return;
    draw(*s, now);
  }
  template <class Print>
  void above(const keel_trainer_state* s, Print&& print) {
    if (!shown_) return print();
    std::fputs("\r\033[K", stdout);
    std::fflush(stdout);
    print();
    if (s) draw(*s, Clock::now());
  }
  // Leaves the last frame on screen (redrawn: a log line may have overwritten it).
  void finish(const keel_trainer_state* s) {
    if (!shown_) return;
    if (s) draw(*s, Clock::now());
    std::fputs("\n", stdout);
    std::fflush(stdout);
    shown_ = false;
  }

 private:
  void draw(const keel_trainer_state& s, Clock::time_point now) {
    const double secs = std::chrono::duration<double>(now - start_time_).count();
    const double rate = secs > 0 ? static_cast<double>(s.step - start_step_) / secs : 0.0;
    const std::string frame =
        "\r\033[K" + prefix_ + progress_text(s.step, s.max_steps, rate, s.loss) + "\r";
    std::fputs(frame.c_str(), stdout);
    std::fflush(stdout);
    last_draw_ = now;
    shown_ = true;
  }

  bool enabled_, shown_ = false;
  std::string prefix_;
  Clock::time_point start_time_ = Clock::now(), last_draw_ = start_time_;
  int64_t start_step_ = 0;
};

bool wants_bar(const std::string& progress) {
  return progress == "always" || (progress == "auto" && isatty(fileno(stdout)));
}

// On rank r > 0 (every_rank = true) each bar frame starts with "[rank r] "; the lines go through
// keel_host.log, whose console tags every line of a process of several with its rank.
class Console : public keel::Hook {
 public:
  explicit Console(const keel::Context& ctx)
      : log_(ctx),
        every_(ctx.get_int("every")),
        bar_(wants_bar(ctx.get_string("progress")),
             ctx.rank() > 0 ? "[rank " + std::to_string(ctx.rank()) + "] " : "") {}

  void on_event(keel_event& ev) override {
    switch (ev.kind) {
      case KEEL_EVENT_TRAIN_START: bar_.start(ev.state); break;
      case KEEL_EVENT_STEP_END: bar_.update(ev.state); break;
      case KEEL_EVENT_METRICS: print(ev); break;
      case KEEL_EVENT_TRAIN_END:
      case KEEL_EVENT_EXCEPTION: bar_.finish(ev.state); break;
      default: break;
    }
  }

 private:
  void print(const keel_event& ev) {
    if (ev.split == nullptr) return;
    const bool train = std::strcmp(ev.split, "train") == 0;
    if (train && records_++ % every_ != 0) return;

    const int64_t step = ev.state ? ev.state->step : 0;
    std::string line;
    if (train) {
      line += "step " + std::to_string(step);
      if (ev.state && ev.state->max_steps > 0) line += "/" + std::to_string(ev.state->max_steps);
    } else {
      line += "eval " + std::string(ev.split) + " step " + std::to_string(step) + ":";
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
    bar_.above(ev.state, [&] { log_(KEEL_LOG_INFO, line); });
  }

  keel::Logger log_;
  int64_t every_;
  int64_t records_ = 0;
  LiveBar bar_;
};

const keel_option_desc kOptions[] = {
    keel::opt_int("every", "1",
                  "print every Nth train record, from the first (eval records always)", 1, 1e12),
    keel::opt_string("progress", "\"auto\"",
                     "live progress bar on stdout (auto: only when stdout is a terminal)",
                     "auto|always|never"),
    kEveryRank,
};

}  // namespace

keel_component_desc console_component() {
  return keel::component<OnRank<Console>>("console",
                                          "metric records as log lines, and a progress bar",
                                          kOptions);
}

}  // namespace sinks
