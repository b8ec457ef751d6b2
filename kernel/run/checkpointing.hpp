// Saving checkpoints of the run: what a checkpoint holds (a snapshot at a step boundary), when
// one is due, and announcing commits to the hooks. The commit protocol itself is the store's
// (checkpoint/store.hpp; several ranks: checkpoint/multi_rank.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/reshard.hpp"

namespace keel {

struct Run;
struct RunConfig;
enum class Moment;

// Whether a checkpoint is due at `moment` (never without [checkpoint]): at the start when
// checkpoint.initial is set (not when resuming); after a step every checkpoint.every_steps
// steps and on a hook's request (a stop signal requests one); after an epoch's end on request
// and after every checkpoint.every_epochs-th completed epoch (epoch index + 1 a multiple of it),
// and at the finish when checkpoint.at_end is set, all three unless this step was saved already.
bool save_due(Run& run, Moment moment);

// Saves a checkpoint of the current step (synchronously, or handed to a background writer
// with checkpoint.async) and announces a synchronous commit (CHECKPOINT_SAVED).
void save_checkpoint(Run& run);

// Whether this rank's asynchronous save has finished (true when none is in flight). With
// several ranks the step's end agrees it over every rank (run/requests.hpp), so that every
// rank finishes the save, and announces it, at the same step.
bool async_save_done(const Run& run);

// An asynchronous save that has finished (or, with `block`, the one in flight): its error fails
// the run here, its commit is announced to the hooks here. With several ranks, every rank
// calls it at the same point (agreed as above, or at the next save or the run's end).
void finish_async_save(Run& run, bool block);

// "rank<r>.<stem>": a checkpoint object of rank r > 0 (rank 0's is plain `stem`).
std::string rank_object(const Run& run, const std::string& stem);
// The object holding this rank's optimizer state: "optimizer" (rank 0's, whole), or with
// [distributed] shard every rank's own part as "rank<r>.optimizer" (rank 0 too, so that a
// checkpoint of the other kind is told apart).
std::string optimizer_object(const Run& run);

// This run's parameters as checkpoints cut them (checkpoint/reshard.hpp): each one's global
// shape and the rows this rank holds (all of them without [distributed] shard).
std::vector<ParamRows> param_rows(const Run& run);

// [data.train]'s integer batch_size option (the micro-batch), or 0 when it has none.
int64_t micro_batch_size(const RunConfig& config);

// Name and version of the plugin of every component, once each.
std::vector<std::pair<std::string, std::string>> plugin_versions(const Run& run);

}  // namespace keel
