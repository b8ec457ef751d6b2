// console: each metric record as one concise log line, and, on a terminal, a live progress bar
// below them:
//   step 100/1875 epoch 0 loss 0.5123 lr 0.001 850.2 samples/s ETA 0:04
//   eval test step 1875: loss 0.41 accuracy 0.8512
// A train line shows the step (of the planned steps), epoch, loss (mean over the log window),
// lr, throughput (tokens/s when the data's tokens are not its samples, else samples/s) and the
// time left at the run's pace so far; an eval line the loss and the loss plugin's task metrics
// (less one that only repeats the loss: bce's logloss).
// The whole record (every key) goes to run.log at debug level, and to metrics.jsonl through
// the jsonl sink. Lines carry no origin prefix (keel_host.log with origin ""): they are the
// run's own output.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "format.hpp"
#include "progress.hpp"
#include "sinks.hpp"

namespace sinks {
namespace {

// Options, each declared once: the schemas below list them, the components read them as
// the types they declare (ctx.get).
constexpr auto kEvery = keel::opt_int(
    "every", "1",
    "print the line of every Nth train record, from the first (eval records "
    "always; run.log gets every record whole)",
    1, 1e12);
constexpr auto kProgress = keel::opt_string(
    "progress", "\"auto\"",
    "live progress bar on stdout between the lines: steps, elapsed time, rate, "
    "ETA (auto: only when stdout is a terminal)",
    "auto|always|never");

using Clock = std::chrono::steady_clock;

// The bar on stdout: drawn when training starts, redrawn on STEP_END at most every 0.25 s (and
// at the last planned step), and with "evaluating" when an evaluation starts. A frame is
// "\r\033[K" + text + "\r": the cursor stays in column 0, so a log line from elsewhere
// overwrites the bar instead of being glued to its end (the kernel's console lines start with
// "\r\033[K" on a terminal, kernel/log.cpp). above() clears the bar, prints a line and redraws
// the bar. The frames go to stdout only, never through the log: run.log holds none.
class LiveBar {
 public:
  LiveBar(bool enabled, std::string prefix) : enabled_(enabled), prefix_(std::move(prefix)) {}

  void start(const keel_trainer_state* s) {
    start_time_ = last_draw_ = Clock::now();
    start_step_ = s ? s->step : 0;
    start_epoch_ = s ? s->epoch : 0;
    if (enabled_ && s) draw(*s, start_time_);
  }
  void update(const keel_trainer_state* s) {
    if (!enabled_ || s == nullptr) return;
    const auto now = Clock::now();
    if (shown_ && now - last_draw_ < std::chrono::milliseconds(250) && s->step != s->max_steps)
      return;
    draw(*s, now);
  }
  // An epoch ended: the pace per epoch that a stream's ETA uses.
  void epoch_end(const keel_trainer_state* s) {
    if (s == nullptr) return;
    epochs_done_ = s->epoch + 1 - start_epoch_;
    epochs_done_s_ = std::chrono::duration<double>(Clock::now() - start_time_).count();
  }
  void evaluating(const keel_trainer_state* s) {
    if (enabled_ && s) draw(*s, Clock::now(), "evaluating");
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
  void draw(const keel_trainer_state& s, Clock::time_point now, const char* note = nullptr) {
    Progress p;
    p.step = s.step;
    p.max_steps = s.max_steps;
    p.epoch = s.epoch;
    p.epochs = s.epochs;
    p.elapsed_s = std::chrono::duration<double>(now - start_time_).count();
    p.steps_per_s = p.elapsed_s > 0 && s.step > start_step_
                        ? static_cast<double>(s.step - start_step_) / p.elapsed_s
                        : 0.0;
    p.epochs_done = epochs_done_;
    p.epochs_done_s = epochs_done_s_;
    p.loss = s.step > start_step_ ? s.loss : NAN;  // none before this process's first step
    p.note = note;
    const std::string frame = "\r\033[K" + prefix_ + progress_text(p) + "\r";
    std::fputs(frame.c_str(), stdout);
    std::fflush(stdout);
    last_draw_ = now;
    shown_ = true;
  }

  bool enabled_, shown_ = false;
  std::string prefix_;
  Clock::time_point start_time_ = Clock::now(), last_draw_ = start_time_;
  int64_t start_step_ = 0, start_epoch_ = 0;
  int64_t epochs_done_ = 0;    // epochs ended since TRAIN_START
  double epochs_done_s_ = 0;   // seconds from TRAIN_START to the end of the last of them
};

bool wants_bar(const std::string& progress) {
  return progress == "always" || (progress == "auto" && isatty(fileno(stdout)));
}

// The metric `key` of a record, or nullptr.
const keel_metric* find(const keel_event& ev, const char* key) {
  for (size_t i = 0; i < ev.metric_count; ++i)
    if (std::strcmp(ev.metrics[i].key, key) == 0) return &ev.metrics[i];
  return nullptr;
}

// " key value" (counts as integers).
std::string text(const keel_metric& m) {
  return std::string(" ") + m.key + " " +
         (is_integer_key(m.key) && std::isfinite(m.value) ? integer(m.value)
                                                          : short_number(m.value));
}

// " key value" of the record's metric `key`, or "" when the record lacks it.
std::string field(const keel_event& ev, const char* key) {
  const keel_metric* m = find(ev, key);
  return m ? text(*m) : "";
}

// The record's every key, as run.log keeps it: "record train step 100: epoch 0 samples 6400 ...".
std::string full_record(const keel_event& ev, int64_t step) {
  std::string line = "record " + std::string(ev.split) + " step " + std::to_string(step) + ":";
  for (size_t i = 0; i < ev.metric_count; ++i)
    if (std::strcmp(ev.metrics[i].key, "step") != 0) line += text(ev.metrics[i]);  // in the prefix
  return line;
}

// The evaluation record's keys that are not the loss plugin's task metrics.
bool eval_bookkeeping(const char* key) {
  return std::strcmp(key, "step") == 0 || std::strcmp(key, "epoch") == 0 ||
         std::strcmp(key, "samples") == 0;
}

// On rank r > 0 (every_rank = true) each bar frame starts with "[rank r] "; the lines go through
// keel_host.log, whose console tags every line of a process of several with its rank.
class Console : public keel::Hook {
 public:
  explicit Console(const keel::Context& ctx)
      : log_(ctx, ""),
        every_(ctx.get(kEvery)),
        bar_(wants_bar(ctx.get(kProgress)),
             ctx.rank() > 0 ? "[rank " + std::to_string(ctx.rank()) + "] " : "") {}

  void on_event(keel_event& ev) override {
    switch (ev.kind) {
      case KEEL_EVENT_TRAIN_START:
        start_time_ = Clock::now();
        start_step_ = ev.state ? ev.state->step : 0;
        bar_.start(ev.state);
        break;
      case KEEL_EVENT_STEP_END: bar_.update(ev.state); break;
      case KEEL_EVENT_EPOCH_END: bar_.epoch_end(ev.state); break;
      case KEEL_EVENT_EVAL_START: bar_.evaluating(ev.state); break;
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
    const int64_t step = ev.state ? ev.state->step : 0;
    log_(KEEL_LOG_DEBUG, full_record(ev, step));  // run.log (and the console at debug)
    if (train && records_++ % every_ != 0) return;
    const std::string line = train ? train_line(ev, step) : eval_line(ev, step);
    bar_.above(ev.state, [&] { log_(KEEL_LOG_INFO, line); });
  }

  std::string train_line(const keel_event& ev, int64_t step) const {
    const int64_t total = ev.state ? ev.state->max_steps : 0;
    std::string line = "step " + std::to_string(step);
    if (total > 0) line += "/" + std::to_string(total);
    line += field(ev, "epoch") + field(ev, "loss") + field(ev, "lr");
    const keel_metric* samples = find(ev, "samples_per_s");
    const keel_metric* tokens = find(ev, "tokens_per_s");
    if (tokens && (!samples || tokens->value != samples->value))
      line += " " + short_number(tokens->value) + " tokens/s";
    else if (samples)
      line += " " + short_number(samples->value) + " samples/s";
    // Time left at the pace since TRAIN_START (evaluations and checkpoints included).
    const double secs = std::chrono::duration<double>(Clock::now() - start_time_).count();
    if (total > 0 && step < total && step > start_step_)
      line += " ETA " + clock_text(secs / static_cast<double>(step - start_step_) *
                                   static_cast<double>(total - step));
    return line;
  }

  static std::string eval_line(const keel_event& ev, int64_t step) {
    std::string line = "eval " + std::string(ev.split) + " step " + std::to_string(step) + ":";
    const keel_metric* loss = find(ev, "loss");
    for (size_t i = 0; i < ev.metric_count; ++i)
      if (!eval_bookkeeping(ev.metrics[i].key) && !repeats_loss(ev.metrics[i], loss))
        line += text(ev.metrics[i]);
    return line;
  }
  // A task metric that is the loss again under its task's name (bce's logloss): another key
  // ending in "loss" whose value reads the same on the line. It stays in the record (run.log,
  // metrics.jsonl).
  static bool repeats_loss(const keel_metric& m, const keel_metric* loss) {
    const size_t n = std::strlen(m.key);
    return loss && &m != loss && n > 4 && std::strcmp(m.key + n - 4, "loss") == 0 &&
           text(m).substr(n + 1) == text(*loss).substr(5);
  }

  keel::Logger log_;
  int64_t every_;
  int64_t records_ = 0;
  Clock::time_point start_time_ = Clock::now();
  int64_t start_step_ = 0;
  LiveBar bar_;
};

const keel_option_desc kConsoleOptions[] = {kEvery, kProgress, kEveryRank};

}  // namespace

keel_component_desc console_component() {
  return keel::component<OnRank<Console>>(
      "console",
      "a concise log line per metric record (the whole record in run.log), and a progress bar",
      kConsoleOptions);
}

}  // namespace sinks
