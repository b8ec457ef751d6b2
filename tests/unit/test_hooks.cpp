// Hooks: a hook written in plain C (tests/fixtures/c_hook.c) is loaded by the kernel, sees
// every event, and sees them in the order documented in abi.h.
#include <algorithm>

#include "manifest.hpp"
#include "loader/registry.hpp"
#include "run_config.hpp"
#include "support.hpp"
#include "run/decisions.hpp"
#include "run/trainer.hpp"

namespace unit_hooks {  // keel_units is one unity build: each file's names stay its own

using keel_test::TempDir;

namespace {

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream s(text);
  for (std::string l; std::getline(s, l);) out.push_back(l);
  return out;
}

// A request a hook (c_event_log's request_* options) sets: `bits` at each event `at` ("EPOCH_END",
// "METRICS test": a line without its detail) of epoch `epoch` and step `step` (-1: any).
struct Request {
  std::string at;
  int64_t epoch = -1, step = -1;
  uint32_t bits = 0;
};

// The shape of a run, as far as the event order depends on it.
struct RunShape {
  int64_t batches;           // batches in an epoch of [data.train]
  int64_t grad_accum;        // [train] grad_accum
  int64_t epochs;            // [train] epochs (0: no limit)
  int64_t max_steps;         // [train] max_steps (0: no limit)
  int64_t log_every;         // [train] log_every
  int64_t eval_every_steps;  // [train] eval_every_steps (0: never)
  bool eval_each_epoch;      // [train] eval_each_epoch
  int64_t every_steps;       // [checkpoint] every_steps (0: never)
  bool at_end;               // [checkpoint] at_end
  bool initial = false;      // [checkpoint] initial
  Request request = {};      // what the hook requests (bits 0: nothing)
};

// The events a run of this shape sends (with [data.test], no init_from), derived from the
// pseudocode above keel_event_kind in abi.h by following it as written. Each line is what
// c_event_log writes with detail = true: the event, the trainer state's epoch and step
// (keel_trainer_state: "optimizer steps completed"), and AFTER_DATA's micro_batch.
// Requests: "the kernel acts on them after the current step, or after the epoch-end events when
// set during those"; so bits set during a step's events (or before its first step) are acted on
// by that step's METRICS/EVAL/CHECKPOINT_SAVED/leave lines, in that order, and bits set during
// the epoch-end events by the epoch-end lines after the event that set them. Requests of the
// final events (the at_end checkpoint, TRAIN_END) are ignored.
std::vector<std::string> documented_order(const RunShape& r) {
  std::vector<std::string> out;
  int64_t epoch = 0, step = 0;
  int64_t unlogged = 0;  // steps since the last "train" METRICS record
  int64_t evaluated_at = -1, saved_at = -1;
  uint32_t requested = 0;  // bits set by the hook and not yet acted on
  const auto event = [&](const std::string& what) {
    out.push_back(what + " e" + std::to_string(epoch) + " s" + std::to_string(step));
    const Request& q = r.request;
    if (what == q.at && (q.epoch < 0 || q.epoch == epoch) && (q.step < 0 || q.step == step))
      requested |= q.bits;
  };
  // EVAL_START, EVAL_END, METRICS (split "test"), unless that step was just evaluated
  const auto evaluate = [&] {
    if (evaluated_at == step) return;
    event("EVAL_START");
    event("EVAL_END");
    event("METRICS test");
    evaluated_at = step;
  };
  const auto log_train = [&] {
    event("METRICS train");
    unlogged = 0;
  };
  const auto save = [&] {
    event("CHECKPOINT_SAVED");
    saved_at = step;
  };

  event("TRAIN_START");
  if (r.initial) save();  // step 0, when [checkpoint] initial = true
  bool run_ends = false;
  for (epoch = 0;; ++epoch) {  // for each epoch:
    event("EPOCH_START");
    int64_t left = r.batches;  // batches not yet fetched in this epoch
    bool complete = false;
    for (;;) {  // for each optimizer step:
      // (fetch up to grad_accum micro-batches; none left: the epoch is complete)
      const int64_t fetched = std::min(r.grad_accum, left);
      left -= fetched;
      if (fetched == 0) {
        complete = true;
        break;
      }
      event("STEP_START");
      for (int64_t i = 0; i < fetched; ++i) {  // AFTER_DATA, once per micro-batch
        event("AFTER_DATA");
        out.back() += " mb" + std::to_string(i);
      }
      event("AFTER_BACKWARD");
      event("BEFORE_OPTIMIZER_STEP");
      ++step;  // (optimizer step)
      ++unlogged;
      event("STEP_END");
      const bool target = r.max_steps > 0 && step >= r.max_steps;
      // every log_every steps, and at a step that reaches max_steps or after which a stop was
      // requested
      if (step % r.log_every == 0 || target || (requested & KEEL_REQUEST_STOP)) log_train();
      // every eval_every_steps, or when requested
      if ((r.eval_every_steps > 0 && step % r.eval_every_steps == 0) ||
          (requested & KEEL_REQUEST_EVAL))
        evaluate();
      // every every_steps, or when requested
      if ((r.every_steps > 0 && step % r.every_steps == 0) ||
          (requested & KEEL_REQUEST_CHECKPOINT))
        save();
      // max_steps reached, or a stop requested: leave the step loop; the rest of this epoch's
      // events follow, then the run ends
      const bool leave = target || (requested & KEEL_REQUEST_STOP);
      // METRICS (split "train") when the evaluation or checkpoint events requested a stop and
      // steps ran since the last record
      if (leave && unlogged > 0) log_train();
      requested = 0;
      if (leave) {
        run_ends = true;
        break;
      }
    }
    const bool final_epoch = r.epochs > 0 && epoch + 1 == r.epochs;
    if (final_epoch && unlogged > 0) log_train();  // final epoch only: the last, partial window
    if (complete) event("EPOCH_END");              // when the epoch is complete
    // after a complete epoch (eval_each_epoch), when the run ends, or when requested by the
    // events above (evaluate(): unless that step was just evaluated). The run ends after the
    // final epoch, after a stop in the step loop, or for a stop requested by the events above.
    if ((r.eval_each_epoch && complete) || final_epoch || run_ends ||
        (requested & (KEEL_REQUEST_EVAL | KEEL_REQUEST_STOP)))
      evaluate();
    // when the run ends and steps ran since the last record
    const auto run_ending = [&] { return final_epoch || run_ends || (requested & KEEL_REQUEST_STOP); };
    if (run_ending() && unlogged > 0) log_train();
    // when requested by the events above, unless just saved
    if ((requested & KEEL_REQUEST_CHECKPOINT) && saved_at != step) {
      save();
      // when that CHECKPOINT_SAVED requested a stop and steps ran since the last record
      if (run_ending() && unlogged > 0) log_train();
    }
    // after the final epoch, or when a stop was requested, the epoch loop ends
    if (final_epoch || (requested & KEEL_REQUEST_STOP)) run_ends = true;
    requested = 0;
    if (run_ends) break;
  }
  if (r.at_end && saved_at != step) save();  // at the end (at_end), unless just saved
  requested = 0;                             // requests of the final events are ignored
  event("TRAIN_END");
  return out;
}

// Runs a small run of `shape` (keel_test::small_run plus `sets`) with c_event_log and checks
// the events it logged against documented_order(shape); `anchor`: lines that must also appear
// in a row.
void check_event_order(const RunShape& shape, const std::vector<std::string>& sets,
                     const std::vector<std::string>& anchor = {}) {
  TempDir d;
  const auto log = d.path / "events.log";
  const Request& q = shape.request;
  const std::string requests =
      q.bits == 0 ? "" : "request_at = \"" + q.at + "\"\nrequest_epoch = " +
                             std::to_string(q.epoch) + "\nrequest_at_step = " +
                             std::to_string(q.step) + "\nrequests = " +
                             std::to_string(q.bits) + "\n";
  const auto p = d.write(
      "m.toml", keel_test::small_run(d.path / "run") + "[checkpoint]\ntype = \"safetensors\"\n"
                    "[plugins]\npaths = [\"" KEEL_FIXTURE_DIR "\"]\n"
                    "[[hooks]]\ntype = \"c_event_log\"\ndetail = true\npath = \"" +
                    log.string() + "\"\n" + requests);
  {
    keel::Registry registry;
    const keel::RunConfig rc = keel::resolve(keel::load_manifest(p.string(), sets), registry);
    keel::apply_process_settings(rc);
    keel::Trainer trainer(rc);
    trainer.train();
  }
  const std::vector<std::string> got = lines(keel_test::read(log)),
                                 expected = documented_order(shape);
  // The first difference, for a readable failure; then the whole sequence.
  size_t i = 0;
  while (i < got.size() && i < expected.size() && got[i] == expected[i]) ++i;
  INFO("first difference at event " << i << ": got '" << (i < got.size() ? got[i] : "<end>")
                                    << "', abi.h says '"
                                    << (i < expected.size() ? expected[i] : "<end>") << "'");
  CHECK(got == expected);
  if (!anchor.empty()) {
    std::string row;
    for (const std::string& l : anchor) row += (row.empty() ? "'" : ", '") + l + "'";
    INFO("expected in a row: " << row);
    CHECK(std::search(got.begin(), got.end(), anchor.begin(), anchor.end()) != got.end());
    CHECK(std::search(expected.begin(), expected.end(), anchor.begin(), anchor.end()) !=
          expected.end());
  }
}


// The events of abi.h's pseudocode (above keel_event_kind) between the line that starts with
// `from` and the next that starts with `to` (after " * " and indentation): the text of each
// line that names an event (its first word is an event name in capitals) up to the description,
// a CHECKPOINT_SAVED described as the asynchronous one marked " (async)".
std::vector<std::string> abi_events(const std::vector<std::string>& pseudocode,
                                    const std::string& from, const std::string& to) {
  std::vector<std::string> out;
  bool inside = false;
  for (const std::string& line : pseudocode) {
    const std::string text = line.substr(std::min(line.find_first_not_of(" *"), line.size()));
    if (!inside) {
      inside = text.rfind(from, 0) == 0;
      continue;
    }
    if (text.rfind(to, 0) == 0) return out;
    const size_t word = text.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ_");
    if (word < 3 || (word != std::string::npos && text[word] != ' ' && text[word] != ',')) continue;
    const size_t gap = text.find("  ");
    std::string event = text.substr(0, gap);
    const std::string said = gap == std::string::npos ? "" : text.substr(gap);
    if (event == "CHECKPOINT_SAVED" && said.find("async = true") != std::string::npos)
      event += " (async)";
    out.push_back(event);
  }
  FAIL("abi.h's pseudocode has no line starting with " << to << " after " << from);
  return out;
}

std::string joined(const std::string& moment, const std::vector<std::string>& events) {
  std::string line = moment + ":";
  for (size_t i = 0; i < events.size(); ++i) line += (i ? ", " : " ") + events[i];
  return line;
}

}  // namespace

TEST_CASE("the event order of a run with accumulation, evaluations and checkpoints is abi.h's") {
  struct Case {
    const char* name;
    RunShape shape;
    std::vector<std::string> sets;  // on keel_test::small_run: 256 train samples, batch 32
    // Lines that must follow each other in the run (written out by hand, a check on the
    // generator as much as on the run).
    std::vector<std::string> anchor = {};
  };
  const auto request = [](const char* at, int64_t epoch, uint32_t bits) {
    return Request{at, epoch, -1, bits};
  };
  const std::vector<Case> cases = {
      // 8 batches an epoch in steps of 3, 3, 2 micro-batches; max_steps stops the run in the
      // middle of the third of 4 epochs; the end is already evaluated and saved (step 8).
      {"stop target mid-epoch",
       {8, 3, 4, 8, 3, 2, true, 4, true},
       {"train.grad_accum=3", "train.epochs=4", "train.max_steps=8", "train.log_every=3",
        "train.eval_every_steps=2", "checkpoint.every_steps=4"}},
      // 7 batches an epoch in steps of 2, 2, 2, 1; the run ends with its 2 epochs, with a
      // partial log window (steps 7, 8), an end-of-epoch evaluation, a checkpoint at the end.
      {"epochs end the run",
       {7, 2, 2, 0, 3, 3, true, 5, true},
       {"data.train.limit=224", "train.grad_accum=2", "train.epochs=2", "train.log_every=3",
        "train.eval_every_steps=3", "checkpoint.every_steps=5"}},
      // max_steps is reached with the last batch of the second epoch: the step loop is left
      // before a fetch finds the epoch over, so that epoch sends no EPOCH_END.
      {"stop target at an epoch boundary",
       {8, 3, 0, 6, 4, 0, true, 0, true},
       {"train.grad_accum=3", "train.epochs=0", "train.max_steps=6", "train.log_every=4"}},
      // [checkpoint] initial: step-0 right after TRAIN_START; no evaluation but the final one,
      // no checkpoint at the end.
      {"initial checkpoint",
       {8, 2, 2, 0, 3, 0, false, 3, false, true},
       {"train.grad_accum=2", "train.log_every=3", "train.eval_each_epoch=false",
        "checkpoint.every_steps=3", "checkpoint.at_end=false", "checkpoint.initial=true"},
       {"TRAIN_START e0 s0", "CHECKPOINT_SAVED e0 s0", "EPOCH_START e0 s0"}},
      // EVAL requested at every EPOCH_END without eval_each_epoch: evaluated after epoch 1 and
      // at the end, but not again after epoch 2, whose last step was evaluated (step 16).
      {"EVAL requested at EPOCH_END",
       {8, 1, 3, 0, 3, 16, false, 0, true, false, request("EPOCH_END", -1, KEEL_REQUEST_EVAL)},
       {"train.epochs=3", "train.log_every=3", "train.eval_each_epoch=false",
        "train.eval_every_steps=16"},
       {"EPOCH_END e0 s8", "EVAL_START e0 s8", "EVAL_END e0 s8", "METRICS test e0 s8",
        "EPOCH_START e1 s8"}},
      // CHECKPOINT requested at every EPOCH_END: saved after each epoch's evaluation, but not
      // again at step 16 (every_steps saved it), nor at the end (just saved).
      {"CHECKPOINT requested at EPOCH_END",
       {8, 2, 3, 0, 4, 0, true, 8, true, false,
        request("EPOCH_END", -1, KEEL_REQUEST_CHECKPOINT)},
       {"train.grad_accum=2", "train.epochs=3", "train.log_every=4", "checkpoint.every_steps=8"},
       {"EPOCH_END e0 s4", "EVAL_START e0 s4", "EVAL_END e0 s4", "METRICS test e0 s4",
        "CHECKPOINT_SAVED e0 s4", "EPOCH_START e1 s4"}},
      // STOP requested by the end-of-epoch evaluation of the first of 3 epochs (as
      // early_stopping does): the run ends with a record of steps 7 and 8 (log_every 3).
      {"STOP requested at the end-of-epoch METRICS test",
       {8, 1, 3, 0, 3, 0, true, 0, true, false,
        request("METRICS test", 0, KEEL_REQUEST_STOP)},
       {"train.epochs=3", "train.log_every=3"},
       {"METRICS train e0 s6", "STEP_START e0 s6", "AFTER_DATA e0 s6 mb0", "AFTER_BACKWARD e0 s6",
        "BEFORE_OPTIMIZER_STEP e0 s6", "STEP_END e0 s7", "STEP_START e0 s7",
        "AFTER_DATA e0 s7 mb0", "AFTER_BACKWARD e0 s7", "BEFORE_OPTIMIZER_STEP e0 s7",
        "STEP_END e0 s8", "EPOCH_END e0 s8", "EVAL_START e0 s8", "EVAL_END e0 s8",
        "METRICS test e0 s8", "METRICS train e0 s8", "CHECKPOINT_SAVED e0 s8", "TRAIN_END e0 s8"}},
      // STOP and CHECKPOINT requested at the first EPOCH_END: the epoch's evaluation, the
      // record of steps 7 and 8, the checkpoint; no checkpoint at the end (just saved).
      {"STOP and CHECKPOINT requested at EPOCH_END",
       {8, 1, 3, 0, 3, 0, true, 0, true, false,
        request("EPOCH_END", 0, KEEL_REQUEST_STOP | KEEL_REQUEST_CHECKPOINT)},
       {"train.epochs=3", "train.log_every=3"},
       {"STEP_END e0 s8", "EPOCH_END e0 s8", "EVAL_START e0 s8", "EVAL_END e0 s8",
        "METRICS test e0 s8", "METRICS train e0 s8", "CHECKPOINT_SAVED e0 s8", "TRAIN_END e0 s8"}},
      // STOP requested at STEP_END of step 5 in the first epoch: that step's record, its
      // evaluation (the run ends), the checkpoint at the end.
      {"STOP requested at STEP_END",
       {8, 1, 3, 0, 3, 0, true, 0, true, false, {"STEP_END", -1, 5, KEEL_REQUEST_STOP}},
       {"train.epochs=3", "train.log_every=3"},
       {"STEP_END e0 s5", "METRICS train e0 s5", "EVAL_START e0 s5", "EVAL_END e0 s5",
        "METRICS test e0 s5", "CHECKPOINT_SAVED e0 s5", "TRAIN_END e0 s5"}},
      // STOP requested by the mid-epoch evaluation of step 5 (early stopping with
      // eval_every_steps): the run ends with a record of steps 4 and 5 (log_every 3).
      {"STOP requested at a mid-epoch evaluation",
       {8, 1, 3, 0, 3, 5, true, 0, true, false, {"METRICS test", 0, 5, KEEL_REQUEST_STOP}},
       {"train.epochs=3", "train.log_every=3", "train.eval_every_steps=5"},
       {"STEP_END e0 s5", "EVAL_START e0 s5", "EVAL_END e0 s5", "METRICS test e0 s5",
        "METRICS train e0 s5", "CHECKPOINT_SAVED e0 s5", "TRAIN_END e0 s5"}},
      // STOP requested at the first EPOCH_END without eval_each_epoch: the run ends, so it is
      // evaluated, then the record of steps 7 and 8.
      {"STOP requested at EPOCH_END without eval_each_epoch",
       {8, 1, 3, 0, 3, 0, false, 0, true, false, request("EPOCH_END", 0, KEEL_REQUEST_STOP)},
       {"train.epochs=3", "train.log_every=3", "train.eval_each_epoch=false"},
       {"STEP_END e0 s8", "EPOCH_END e0 s8", "EVAL_START e0 s8", "EVAL_END e0 s8",
        "METRICS test e0 s8", "METRICS train e0 s8", "CHECKPOINT_SAVED e0 s8", "TRAIN_END e0 s8"}},
  };
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    check_event_order(c.shape, c.sets, c.anchor);
  }
}

TEST_CASE("EVAL, CHECKPOINT and STOP requested at every event are acted on as abi.h says") {
  // Requests made at each event a hook sees during training, in the first epoch's third step
  // (or at any step for events without one); the generator follows abi.h's rules.
  const char* events[] = {"TRAIN_START", "EPOCH_START", "STEP_START", "AFTER_DATA",
                          "AFTER_BACKWARD", "BEFORE_OPTIMIZER_STEP", "STEP_END",
                          "METRICS train", "EVAL_START", "EVAL_END", "METRICS test",
                          "EPOCH_END", "CHECKPOINT_SAVED"};
  for (const char* at : events) {
    for (const uint32_t bits : {KEEL_REQUEST_EVAL, KEEL_REQUEST_CHECKPOINT, KEEL_REQUEST_STOP}) {
      const std::string name = std::string(at) + " requests " + std::to_string(bits);
      CAPTURE(name);
      // 8 batches an epoch, 3 epochs, records every 3 steps, evaluations every 3 steps and
      // checkpoints every 4 (so that METRICS, EVAL_* and CHECKPOINT_SAVED occur mid-epoch).
      const std::string where(at);
      const int64_t step = where == "TRAIN_START" || where == "EPOCH_START" ? 0
                           : where == "EPOCH_END"                         ? -1
                           : where == "CHECKPOINT_SAVED"                  ? 4
                           : where == "STEP_START" || where == "AFTER_DATA" ||
                                   where == "AFTER_BACKWARD" ||
                                   where == "BEFORE_OPTIMIZER_STEP"
                               ? 2
                               : 3;
      const RunShape shape{8, 1, 3, 0, 3, 3, true, 4, true, false, Request{at, 0, step, bits}};
      check_event_order(shape, {"train.epochs=3", "train.log_every=3",
                                "train.eval_every_steps=3", "checkpoint.every_steps=4"});
    }
  }
}

TEST_CASE("the C hook sees every event in the documented order") {
  TempDir d;
  const auto log = d.path / "events.log";
  const auto p = d.write(
      "m.toml", keel_test::small_run(d.path / "run") +
                    "[checkpoint]\ntype = \"safetensors\"\nevery_steps = 8\n"
                    "[plugins]\npaths = [\"" KEEL_FIXTURE_DIR "\"]\n"
                    "[[hooks]]\ntype = \"c_event_log\"\npath = \"" + log.string() + "\"\n");
  keel::Registry registry;
  const keel::RunConfig rc = keel::resolve(keel::load_manifest(p.string(), {}), registry);
  REQUIRE(rc.hooks.size() == 1);
  CHECK(rc.hooks[0].component->plugin->descriptor->fingerprint.torch_version == nullptr);
  {
    keel::apply_process_settings(rc);
    keel::Trainer trainer(rc);
    trainer.train();
  }

  // 256 samples / batch 32 = 8 steps an epoch, a train record every 4 steps, 2 epochs.
  std::vector<std::string> expected = {"TRAIN_START"};
  for (int epoch = 0; epoch < 2; ++epoch) {
    expected.push_back("EPOCH_START");
    for (int half = 0; half < 2; ++half) {
      for (int i = 0; i < 4; ++i)
        for (const char* e :
             {"STEP_START", "AFTER_DATA", "AFTER_BACKWARD", "BEFORE_OPTIMIZER_STEP", "STEP_END"})
          expected.push_back(e);
      expected.push_back("METRICS train");
    }
    expected.push_back("CHECKPOINT_SAVED");
    expected.push_back("EPOCH_END");
    expected.push_back("EVAL_START");
    expected.push_back("EVAL_END");
    expected.push_back("METRICS test");
  }
  expected.push_back("TRAIN_END");
  CHECK(lines(keel_test::read(log)) == expected);
}

TEST_CASE("a failing hook ends the run with an error naming the hook") {
  TempDir d;
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run") +
                                       "[plugins]\npaths = [\"" KEEL_FIXTURE_DIR "\"]\n"
                                       "[[hooks]]\ntype = \"c_event_log\"\npath = \"" +
                                       (d.path / "no/such/dir/x.log").string() + "\"\n");
  keel::Registry registry;
  const keel::RunConfig rc = keel::resolve(keel::load_manifest(p.string(), {}), registry);
  const std::string err = keel_test::error_of([&] { keel::Trainer trainer(rc); });
  CHECK(err.rfind("[hooks[0]] hook 'c_event_log' (plugin ", 0) == 0);
  CHECK(err.find("no/such/dir/x.log") != std::string::npos);
}

TEST_CASE("hooks run in ascending priority, ties in manifest order") {
  TempDir d;
  const auto log = (d.path / "events.log").string();
  auto hook = [&](const char* tag, int priority) {
    return "[[hooks]]\ntype = \"c_event_log\"\npath = \"" + log + "\"\ntag = \"" + tag +
           "\"\npriority = " + std::to_string(priority) + "\n";
  };
  const auto p = d.write("m.toml", keel_test::small_run(d.path / "run") +
                                       "[plugins]\npaths = [\"" KEEL_FIXTURE_DIR "\"]\n" +
                                       hook("a", 5) + hook("b", -1) + hook("c", 5));
  keel::Registry registry;
  const keel::RunConfig rc =
      keel::resolve(keel::load_manifest(p.string(), {"train.epochs=1"}), registry);
  {
    keel::apply_process_settings(rc);
    keel::Trainer trainer(rc);
    trainer.train();
  }
  const auto got = lines(keel_test::read(log));
  REQUIRE(got.size() % 3 == 0);
  for (size_t i = 0; i < got.size(); i += 3) {
    CHECK(got[i].rfind("b ", 0) == 0);
    CHECK(got[i + 1].rfind("a ", 0) == 0);
    CHECK(got[i + 2].rfind("c ", 0) == 0);
    CHECK(got[i].substr(2) == got[i + 1].substr(2));
  }
}

// The decision table (kernel/run/decisions.cpp) is the one source of the order of the events
// after a step and at an epoch's end: abi.h's pseudocode, read line by line, names the same
// events at each moment in the same order, and docs/loop.md shows the table as the kernel
// describes it.
TEST_CASE("abi.h's pseudocode and docs/loop.md follow the kernel's decision table") {
  const std::vector<std::string> abi = lines(keel_test::read(
      std::string(KEEL_SOURCE_ROOT) + "/sdk/include/keel/abi.h"));
  const auto begin = std::find_if(abi.begin(), abi.end(), [](const std::string& l) {
    return l.find("The call order, as the kernel runs it") != std::string::npos;
  });
  REQUIRE(begin != abi.end());
  const std::vector<std::string> pseudocode(begin, abi.end());
  std::vector<std::string> epoch =
      abi_events(pseudocode, "the rest of this epoch's events follow", "(after the final epoch");
  const auto epoch_end = std::find(epoch.begin(), epoch.end(), "EPOCH_END");
  REQUIRE(epoch_end != epoch.end());
  const std::vector<std::string> from_abi = {
      joined("start", abi_events(pseudocode, "TRAIN_START", "for each epoch")),
      joined("step end", abi_events(pseudocode, "STEP_END", "(max_steps")),
      joined("epoch over", {epoch.begin(), epoch_end}),
      "EPOCH_END",
      joined("epoch end", {epoch_end + 1, epoch.end()}),
      joined("finish", abi_events(pseudocode, "(after the final epoch", "TRAIN_END")),
  };
  CHECK(from_abi == keel::describe_decisions());

  const std::vector<std::string> docs = lines(keel_test::read(
      std::string(KEEL_SOURCE_ROOT) + "/docs/loop.md"));
  const auto table = std::find(docs.begin(), docs.end(), "```decision-table");
  REQUIRE(table != docs.end());
  const std::vector<std::string> shown(table + 1, std::find(table + 1, docs.end(), "```"));
  CHECK(shown == keel::describe_decisions());
}

}  // namespace unit_hooks
