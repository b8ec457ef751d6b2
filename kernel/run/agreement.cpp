#include "run/agreement.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <string>
#include <vector>

#include "distributed/process_group.hpp"
#include "error.hpp"
#include "run/run.hpp"
#include "text/text.hpp"

namespace keel {

namespace {

// Collectives issued so far by this process: ProcessGroup's, and the gradient reducer's.
struct Issued {
  int64_t agreements = 0, all_reduces = 0, shard_ops = 0;
};

Issued issued(const Run& run) {
  Issued n;
  if (run.shards) n.shard_ops = run.shards->collectives_issued();
  if (run.ranks.group) n.agreements = run.ranks.group->collectives_issued() - n.shard_ops;
  if (run.grad_sync) n.all_reduces = run.grad_sync->all_reduces();
  return n;
}

}  // namespace

EpochPlan agree_epoch_plan(ProcessGroup& group, int64_t batches, int64_t steps,
                           const std::string& data) {
  const bool stream = batches == -1;
  const std::vector<double> most = group.max(
      {-static_cast<double>(batches), -static_cast<double>(steps), stream ? 1.0 : 0.0,
       stream ? 0.0 : 1.0},
      "agreeing on the batches per epoch and the planned steps");
  if (most[2] > 0 && most[3] > 0)
    throw Error(fmt::format("{}: batches_per_epoch is -1 (a stream) on some ranks and a count "
                            "on others (this rank: {}); hint: give every rank the same data "
                            "options", data, batches));
  if (stream) return {0, static_cast<int64_t>(-most[1])};
  return {static_cast<int64_t>(-most[0]), static_cast<int64_t>(-most[1])};
}

void CollectiveTally::step_starts(const Run& run) {
  const Issued n = issued(run);
  mark_agreements = n.agreements;
  mark_all_reduces = n.all_reduces;
  mark_shard_ops = n.shard_ops;
}

void CollectiveTally::step_ended(const Run& run) {
  const Issued n = issued(run);
  steps += 1;
  agreements += n.agreements - mark_agreements;
  all_reduces += n.all_reduces - mark_all_reduces;
  shard_ops += n.shard_ops - mark_shard_ops;
}

void log_collectives(const Run& run) {
  if (!run.ranks.group || run.ranks.rank != 0) return;
  const CollectiveTally& t = run.collectives;
  const Issued all = issued(run);
  const int64_t in_steps = t.agreements + t.all_reduces + t.shard_ops;
  const int64_t outside = all.agreements + all.all_reduces + all.shard_ops - in_steps;
  const std::string per_step =
      t.steps > 0 ? text::number(std::round(100.0 * in_steps / t.steps) / 100) : "0";
  const std::string shard_ops =
      run.shards ? fmt::format(", {} shard collectives (gradient reduce-scatters, parameter "
                               "all-gathers, the clipper's norm)", t.shard_ops)
                 : "";
  // The console gets the totals; run.log the breakdown (the line tests and bench_ddp.py read).
  spdlog::info("collectives: {} in {} steps ({} per step), {} outside steps; the breakdown is in "
               "run.log", in_steps, t.steps, per_step, outside);
  spdlog::debug("collectives: {} in {} steps ({} per step: {} agreements, {} gradient bucket "
               "all-reduces{}); {} outside steps (setup, records, evaluations, checkpoints, "
               "epoch ends, the end); not counted: the reducer's broadcasts of its rebuilt "
               "buckets (once), exchanges through the store and the components' keel_comm "
               "calls ({})",
               in_steps, t.steps, per_step, t.agreements, t.all_reduces, shard_ops, outside,
               run.comm ? run.comm->calls() : 0);
}

}  // namespace keel
