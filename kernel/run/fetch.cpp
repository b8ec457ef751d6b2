// The training data's micro-batches for each step (fetch.hpp).
#include "run/fetch.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <string>
#include <vector>

#include "run/events.hpp"
#include "run/run.hpp"
#include "run/signals.hpp"

namespace keel {

namespace {

// Up to `count` micro-batches of the training data (fewer at the end of its epoch).
std::vector<MicroBatch> next_micro_batches(Run& run, int64_t count) {
  std::vector<MicroBatch> out;
  for (int64_t i = 0; i < count; ++i) {
    MicroBatch mb;
    const NextResult result = next_batch(run.components.train_source, run.ranks.device, &mb);
    if (result == NextResult::kStopped) run.epoch.stopped = StopSignals::received();
    if (result != NextResult::kBatch) break;
    out.push_back(std::move(mb));
  }
  return out;
}

// Past the agreed micro-batches of the epoch: every rank takes as many as the rank with the
// fewest (none: the epoch ends on every rank), agreed with one all-reduce, so that all run
// the same gradient all-reduces.
void agree_on_fetched(Run& run, std::vector<MicroBatch>& out) {
  const size_t fewest = static_cast<size_t>(-run.ranks.group->max(
      {-static_cast<double>(out.size())},
      "agreeing on the batches of step " + std::to_string(run.progress.step + 1))[0]);
  if (fewest < out.size()) {
    spdlog::warn("{} has {} more micro-batch(es) in epoch {} than another rank: left out "
                 "(hint: shard the data evenly, e.g. fashion_mnist remainder = \"pad\" or "
                 "\"drop\")", run.components.train_data.label(), out.size() - fewest,
                 run.progress.epoch);
    out.resize(fewest);
  }
}

// A stream (no agreed count): every rank must take as many micro-batches as every other, so
// that all end each epoch at the same step. One all-reduce (a max over one field per rank,
// rank r's count in field r and -1 in the others) gives every rank each rank's count, and in
// one more field the signal with which a rank's data stopped while waiting (0: none), which
// every rank then takes as its own; unequal counts fail every rank at once with one line naming
// them.
void agree_on_stream(Run& run, const std::vector<MicroBatch>& out) {
  const int64_t step = run.progress.step + 1;
  std::vector<double> counts(static_cast<size_t>(run.ranks.world) + 1, -1.0);
  counts[static_cast<size_t>(run.ranks.rank)] = static_cast<double>(out.size());
  counts.back() = run.epoch.stopped;
  counts = run.ranks.group->max(counts, "agreeing on the batches of step " + std::to_string(step));
  run.epoch.stopped = static_cast<int>(counts.back());
  counts.pop_back();
  if (std::all_of(counts.begin(), counts.end(), [&](double c) { return c == counts[0]; })) return;
  std::string each;
  for (size_t r = 0; r < counts.size(); ++r)
    each += fmt::format("{}rank {} {}", r ? ", " : "", r, static_cast<int64_t>(counts[r]));
  throw run.components.train_data.error(fmt::format(
      "a stream whose ranks' data ends epoch {} at different steps: micro-batches for step {} "
      "(up to {}): {}, after {} in this epoch{}; hint: a stream (batches_per_epoch -1) must "
      "give every rank the same number of batches in each window{}",
      run.progress.epoch, step, run.plan.grad_accum, each, run.epoch.batches,
      run.epoch.stopped ? " (a rank's data stopped while waiting for data, another's did not)"
                        : "",
      run.epoch.stopped ? ", and a stop while waiting for data needs the signal on every rank"
                        : ""));
}

// A micro-batch's rows: its tensors' first dimension (the same in all, next_batch checks).
int64_t rows_of(const MicroBatch& mb) { return mb.tensors.front().second.size(0); }

}  // namespace

std::vector<MicroBatch> split_rows(std::vector<MicroBatch> batches, int64_t rows) {
  if (rows <= 0) return batches;
  std::vector<MicroBatch> out;
  for (MicroBatch& mb : batches) {
    const int64_t n = rows_of(mb);
    if (n <= rows) {
      out.push_back(std::move(mb));
      continue;
    }
    // The share of a count (samples, tokens) in rows [0, end): split at the same points, the
    // shares sum to the whole.
    auto before = [n](int64_t count, int64_t end) {
      return static_cast<int64_t>(static_cast<__int128>(count) * end / n);
    };
    for (int64_t start = 0; start < n; start += rows) {
      const int64_t len = std::min(rows, n - start);
      MicroBatch part;
      part.source = mb.source;
      for (const auto& [name, t] : mb.tensors) part.tensors.emplace_back(name, t.narrow(0, start, len));
      part.samples = before(mb.samples, start + len) - before(mb.samples, start);
      part.tokens = before(mb.tokens, start + len) - before(mb.tokens, start);
      out.push_back(std::move(part));
    }
  }
  return out;
}

std::vector<MicroBatch> micro_batches(Run& run, const std::vector<MicroBatch>& batches) {
  const int64_t rows = run.config.train.micro_batch_size;
  std::vector<MicroBatch> mbs = split_rows(batches, rows);
  if (rows <= 0 || !run.ranks.group) return mbs;
  int64_t total = 0;
  for (const MicroBatch& mb : mbs) total += rows_of(mb);
  const int64_t step = run.progress.step + 1;
  // The most micro-batches of any rank, and the fewest rows (as a max of its negation).
  const std::vector<double> agreed = run.ranks.group->max(
      {static_cast<double>(mbs.size()), -static_cast<double>(total)},
      "agreeing on the micro-batches of step " + std::to_string(step));
  const auto most = static_cast<int64_t>(agreed[0]);
  const auto fewest_rows = static_cast<int64_t>(-agreed[1]);
  if (fewest_rows == 0) return mbs;  // a rank without data: the step's agreement fails it
  if (fewest_rows < most)
    throw Error(fmt::format("[train] micro_batch_size = {}: at step {} a rank's batches hold {} "
                            "row(s), too few for the {} micro-batches another rank's make (this "
                            "rank's: {} rows, {} micro-batches), and every rank runs as many; "
                            "hint: give every rank batches of the same size (e.g. fashion_mnist "
                            "remainder = \"pad\" or \"drop\"), or raise micro_batch_size",
                            rows, step, fewest_rows, most, total, mbs.size()));
  while (static_cast<int64_t>(mbs.size()) < most) {
    const auto largest = std::max_element(
        mbs.begin(), mbs.end(),
        [&](const MicroBatch& a, const MicroBatch& b) { return rows_of(a) < rows_of(b); });
    std::vector<MicroBatch> halves = split_rows({*largest}, (rows_of(*largest) + 1) / 2);
    const auto at = mbs.erase(largest);
    mbs.insert(at, std::make_move_iterator(halves.begin()), std::make_move_iterator(halves.end()));
  }
  return mbs;
}

std::vector<MicroBatch> fetch_micro_batches(Run& run) {
  const auto t0 = Clock::now();
  profile_begin(run, "data");
  // With several ranks, within the agreed micro-batches of the epoch every rank takes its
  // share without asking the others; a rank whose data yields fewer marks them missing.
  const int64_t left = run.plan.epoch_batches - run.epoch.batches;
  const bool within = run.ranks.group && left > 0;
  const int64_t want = within ? std::min(run.plan.grad_accum, left) : run.plan.grad_accum;
  std::vector<MicroBatch> out = next_micro_batches(run, want);
  profile_end(run, "data");
  if (run.epoch.stopped && run.ranks.group && !run.plan.stream)
    throw run.components.train_data.error(fmt::format(
        "stopped while waiting for data (KEEL_BATCH_STOPPED) in a run of {} ranks, which only a "
        "stream (batches_per_epoch -1) may do: the ranks could not agree on where the epoch "
        "stands; hint: run it on one process, or make the dataset a stream", run.ranks.world));
  run.epoch.missing = within ? want - static_cast<int64_t>(out.size()) : 0;
  if (run.ranks.group && !within) {
    if (run.plan.stream)
      agree_on_stream(run, out);
    else
      agree_on_fetched(run, out);
  }
  run.window.data_s += std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

}  // namespace keel
