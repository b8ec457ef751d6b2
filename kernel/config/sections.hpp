// The kernel's keys of the manifest, one struct per section, as the parts of the run that use
// them take them (the checkpoint store takes CheckpointKeys as it is). LibTorch-free.
//
// Every key is declared once, in the rows of config/keys.cpp: its type, default, help, the
// member below it lands in, and whether changing it on --resume keeps the run exact. The members
// here carry no defaults of their own (zero / empty until resolve fills them from the rows).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace keel {

// Choice keys land in enums whose order is the order of the row's choices ("a|b|c").
enum class RunMode { kTrainAndEvaluate, kTrain, kEvaluate };  // train_and_evaluate|train|evaluate
enum class Precision { kFp32, kBf16, kFp16 };                   // fp32|bf16|fp16
enum class NonFinite { kError, kSkip };                          // error|skip
enum class AccumNorm { kAuto, kMean, kItems };                   // auto|mean|items
enum class BestMode { kMin, kMax };                              // min|max
enum class ShardMode { kNone, kOptimizer, kGradients, kParameters };  // none|optimizer|gradients|parameters

// [run]
struct RunKeys {
  std::string name;
  std::string output_dir;  // absolute once resolved (default runs/<name>)
  uint64_t seed = 0;
  int64_t threads = 0;  // 0: the cores / the processes on this machine
  std::string device;   // "cpu", "cuda", "cuda:N", "auto" (validated)
  std::string device_where;  // not a row: "FILE:LINE:COL: run.device" or "--set run.device" (for
                             // the errors of the run's start, when the device is missing)
  RunMode mode = RunMode::kTrainAndEvaluate;
  bool malloc_tuning = false;
};

// [train]
struct TrainKeys {
  // Stop targets: whichever is reached first (0: no limit).
  int64_t epochs = 0;
  int64_t max_steps = 0;
  int64_t max_samples = 0;
  int64_t max_tokens = 0;
  int64_t grad_accum = 0;  // batches of [data.train] per optimizer step
  // Rows per micro-batch: each batch is split along dimension 0 into micro-batches of at most
  // this many rows (0: a batch is one micro-batch) (run/fetch.hpp, split_rows).
  int64_t micro_batch_size = 0;
  // Samples per optimizer step over all ranks (0: not given). When given, [data.train]
  // batch_size is the micro-batch and the run derives the micro-batches per rank and step
  // (run/assemble.cpp: StepPlan::grad_accum).
  int64_t global_batch = 0;
  std::string global_batch_where;  // not a row: where global_batch was set (resolve), for errors
  AccumNorm accum_normalization = AccumNorm::kAuto;
  Precision precision = Precision::kFp32;
  NonFinite nonfinite = NonFinite::kError;
  int64_t max_skips = 0;
  int64_t log_every = 0;
  bool eval_each_epoch = false;
  bool eval_at_start = false;  // a fresh run evaluates at step 0, before step 1
  int64_t eval_every_steps = 0;  // 0: only per epoch / at the end
  int64_t eval_max_batches = 0;  // 0: the whole split
};

// [distributed] (used when a launcher started several processes; see distributed/launch.hpp)
struct DistributedKeys {
  int64_t timeout_s = 0;
  std::string backend;
  int64_t bucket_cap_mb = 0;
  ShardMode shard = ShardMode::kNone;  // what each rank holds of the optimizer state
};

// The kernel's keys of [checkpoint] (the backend's own options are in its ComponentSpec).
// Retention (the store): keep_last, keep_best, best_metric, best_mode; all 0: keep everything.
struct CheckpointKeys {
  int64_t every_steps = 0;
  int64_t every_epochs = 0;  // after every N-th completed epoch (a stream's windows); 0: never
  int64_t keep_last = 0;  // newest N by step (0 with keep_best 0: keep all)
  int64_t keep_best = 0;  // best N by best_metric
  std::string best_metric;  // "<split>.<key>", e.g. "test.loss"
  BestMode best_mode = BestMode::kMin;
  bool at_end = false;
  bool initial = false;
  bool async = false;
  // Warm start: checkpoint directory whose model weights start the run, which of them
  // (ECMAScript regexes searched in the model's tensor names; "" = all / none), and
  // [checkpoint.init_rename] prefix rewrites (checkpoint prefix -> model prefix).
  std::string init_from;
  std::string init_include, init_exclude;
  std::vector<std::pair<std::string, std::string>> init_rename;
  // init_from of a directory without a commit record with a backend other than safetensors
  // (whose files hold no code and are checked against their size): only when the user says so.
  bool init_from_unverified = false;
};

}  // namespace keel
