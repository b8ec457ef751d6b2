#include "run/assemble.hpp"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "distributed/on_rank0.hpp"
#include "keel/tensor.hpp"
#include "run/agreement.hpp"
#include "run/events.hpp"
#include "run/hook_names.hpp"
#include "run/model_view.hpp"
#include "run/own_step.hpp"
#include "run/parameters.hpp"
#include "run/resume.hpp"
#include "run/run.hpp"
#include "run/step_modes.hpp"
#include "run/tables.hpp"
#include "text/text.hpp"

namespace keel {

namespace {

// [run] device as a LibTorch device: "cuda" is the GPU of the launcher's LOCAL_RANK (0 when
// running alone), "auto" that GPU when CUDA is available, else the CPU.
at::Device resolve_device(const std::string& name, const std::string& where, int local_rank) {
  if (name == "auto" && !at::hasCUDA()) return at::Device(at::kCPU);
  std::optional<c10::Device> parsed;
  if (name != "auto") {
    try {
      parsed = c10::Device(name);
    } catch (const c10::Error&) {
      throw Error(where + " = \"" + name + "\": not a device; hint: use \"cpu\", \"cuda\", "
                  "\"cuda:N\" or \"auto\"");
    }
    if (parsed->is_cpu()) return at::Device(at::kCPU);
    if (!parsed->is_cuda())
      throw Error(where + " = \"" + name + "\": keel runs on the CPU or CUDA devices; hint: "
                  "use \"cpu\", \"cuda\", \"cuda:N\" or \"auto\"");
  }
  const int index = parsed && parsed->has_index() ? parsed->index() : local_rank;
  if (!at::hasCUDA())
    throw Error(where + " = \"" + name + "\": CUDA is not available to this process; hint: use "
                "device = \"cpu\" or \"auto\"");
  const int count = at::detail::getCUDAHooks().getNumGPUs();
  if (index >= count)
    throw Error(fmt::format("{} = \"{}\" means CUDA device {}, and this machine has {}; hint: "
                            "one process per GPU (torchrun --nproc_per_node={}), or name a "
                            "device below {}", where, name, index, count, count, count));
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

// The run's device, and the process group when a launcher started several processes, or one
// process with [distributed] shard set (a group of one, whose sharded step runs the same
// collectives as on several ranks: FSDP's and torchtitan's one-GPU runs under torchrun).
void join_ranks(Run& run, const std::optional<Launch>& launch) {
  const RunConfig& config = run.config;
  Ranks& ranks = run.ranks;
  ranks.device = resolve_device(config.run.device, config.run.device_where,
                                launch ? launch->local_rank : 0);
  ranks.device_name = ranks.device.str();
  if (launch && (launch->world_size > 1 || config.distributed.shard != ShardMode::kNone)) {
    DistributedOptions o;
    o.timeout = std::chrono::seconds(config.distributed.timeout_s);
    o.backend = config.distributed.backend;
    o.bucket_bytes = config.distributed.bucket_cap_mb << 20;
    ranks.group = std::make_unique<ProcessGroup>(*launch, o, ranks.device);
    ranks.rank = launch->rank;
    ranks.world = launch->world_size;
    spdlog::info("rank {} of {} ({}, local rank {} of {}), {} backend, device {}", ranks.rank,
                 ranks.world, launch->launcher, launch->local_rank, launch->local_world_size,
                 ranks.group->backend_name(), ranks.device.str());
  }
  run.requests.attach(ranks.group.get(), &run.progress);
  // Every component's keel_comm (run/parameters.cpp, context()): copies when alone.
  run.comm = std::make_unique<ComponentComm>(ranks.group.get());
}

// Rank 0 prepares the run directory; the components get its path, or a scratch directory
// when only validating (so that validating never touches a run directory's files).
void open_run_directory(Run& run, bool validate_only) {
  run.resolved_manifest = resolved_text(run.config);
  const std::string dir = on_rank0(
      run.ranks.group.get(), run.ranks.rank,
      "prepare the run directory " + run.config.run.output_dir, [&] {
        return prepare_run_directory(run.directory, run.config, run.resolved_manifest,
                                     validate_only);
      });
  run.directory.path = validate_only ? run.directory.scratch.create() : dir;
}

// The run's planned length in optimizer steps (0: unknown): the nearest of the epochs and the
// max_* targets, for schedules and progress.
int64_t plan_length(const Run& run, int64_t batches) {
  const RunConfig& config = run.config;
  const Instance<keel_dataset>& data = run.components.train_data;
  const int64_t accum = run.plan.grad_accum;
  const int64_t steps_per_epoch = (batches + accum - 1) / accum;
  std::vector<int64_t> plans;
  if (config.train.epochs > 0) plans.push_back(config.train.epochs * steps_per_epoch);
  if (config.train.max_steps > 0) plans.push_back(config.train.max_steps);
  if (config.train.max_samples > 0) {
    const int64_t size = data.get("size", data->size);
    if (size <= 0)
      throw data.error(
          fmt::format("size returned {}; train.max_samples needs the samples per epoch", size));
    // Samples of all ranks per optimizer step (size and batches are this rank's shard's).
    const double per_step =
        static_cast<double>(size) / batches * accum * run.ranks.world;
    plans.push_back(static_cast<int64_t>(std::ceil(config.train.max_samples / per_step)));
  }
  if (config.train.max_tokens > 0) {
    // Tokens of all ranks per optimizer step, from the dataset's tokens per sample (ABI 1.4).
    const int64_t tps = KEEL_HAS_SLOT(data, keel_dataset, tokens_per_sample)
                            ? data.get("tokens_per_sample", data->tokens_per_sample)
                            : 0;
    const int64_t size = data.get("size", data->size);
    if (tps > 0 && size > 0) {
      const double per_step = static_cast<double>(size) / batches * accum * run.ranks.world *
                              static_cast<double>(tps);
      plans.push_back(static_cast<int64_t>(std::ceil(config.train.max_tokens / per_step)));
    } else {
      spdlog::warn("{}: does not report a fixed number of tokens per sample, so train.max_tokens "
                   "stops the run but does not plan its length (schedules and progress use the "
                   "other targets{})",
                   data.label(), plans.empty() ? "; there are none: the length is unknown" : "");
    }
  }
  return plans.empty() ? 0 : *std::min_element(plans.begin(), plans.end());
}

// A stream's planned length: max_steps (0 without it: unknown). Its epochs (windows), and
// max_samples and max_tokens, still end the run; they plan nothing, having no known size.
int64_t stream_length(const Run& run) {
  const int64_t steps = run.config.train.max_steps;
  spdlog::info("{}: a stream: each epoch is a window that ends when the data says so; the run "
               "plans {}", run.components.train_data.label(),
               steps > 0 ? fmt::format("max_steps = {} steps", steps) : "no length");
  if (steps <= 0)
    spdlog::debug("{}: batches_per_epoch -1, so schedules get total_steps = 0 (set "
                  "train.max_steps for one that needs a length)",
                  run.components.train_data.label());
  return steps;
}

// The micro-batches per rank and step: [train] grad_accum, or with [train] global_batch,
// global_batch / ([data.train] batch_size x `world` ranks), which must divide exactly.
int64_t micro_batches_per_step(const RunConfig& config, int world) {
  const TrainKeys& train = config.train;
  if (train.global_batch <= 0) return train.grad_accum;
  const std::string at = train.global_batch_where;
  const auto b = config.train_data.options.values.find("batch_size");
  if (b == config.train_data.options.values.end() || !std::holds_alternative<int64_t>(b->second))
    throw Error(fmt::format("{} = {} needs an integer batch_size option of [data.train] (the "
                            "micro-batch), and its dataset has none; hint: remove global_batch "
                            "and set grad_accum", at, train.global_batch));
  const int64_t batch = std::get<int64_t>(b->second);
  const int64_t per_pass = batch * world;
  if (batch <= 0 || train.global_batch % per_pass != 0)
    throw Error(fmt::format("{} = {} is not a multiple of [data.train] batch_size {} x {} "
                            "rank(s) = {}; hint: make global_batch a multiple of {}, or change "
                            "batch_size", at, train.global_batch, batch, world, per_pass,
                            per_pass));
  const int64_t accum = train.global_batch / per_pass;
  spdlog::info("train.global_batch = {}: {} micro-batch(es) of {} per rank and step, on {} "
               "rank(s)", train.global_batch, accum, batch, world);
  return accum;
}

// Data (the evaluation sets only when the run evaluates), and the run's planned length.
void create_data(Run& run) {
  Components& c = run.components;
  c.train_data = make_instance<keel_dataset>(run, run.config.train_data);
  c.train_source = with_batches(c.train_data);
  if (run.evaluates())
    for (const EvalSetSpec& set : run.config.eval_sets)
      c.eval_sets.push_back({set.name, make_instance<keel_dataset>(run, set.data), {}});
  for (Components::EvalSet& set : c.eval_sets) set.source = with_batches(set.data);
  const int64_t batches = c.train_data.get("batches_per_epoch", c.train_data->batches_per_epoch);
  run.plan.stream = batches == -1 && c.train_data.abi_minor() >= 9;  // (1.9) a stream
  if (batches <= 0 && !run.plan.stream)
    throw c.train_data.error(fmt::format("batches_per_epoch returned {}: the training split "
                                         "yields no batches; hint: check its path, limit and "
                                         "batch_size", batches));
  run.plan.total_steps = run.plan.stream ? stream_length(run) : plan_length(run, batches);
  if (run.ranks.group) {
    const EpochPlan agreed = agree_epoch_plan(*run.ranks.group, batches, run.plan.total_steps,
                                              c.train_data.label());
    run.plan.epoch_batches = agreed.batches;
    run.plan.total_steps = agreed.steps;
  }
}

// The optimizer over the parameter groups, and its base learning rates.
void create_optimizer(Run& run) {
  const RunConfig& config = run.config;
  const ParamGroups groups = assign_param_groups(run);
  keel_create_context ctx = update_context(run, config.optimizer);
  ctx.param_group = groups.of_param.data();
  ctx.group_count = groups.lr.size();
  ctx.group_lr = groups.lr.data();
  ctx.group_weight_decay = groups.weight_decay.data();
  Instance<keel_optimizer>& optimizer = run.components.optimizer;
  optimizer = create_instance<keel_optimizer>(*config.optimizer.component, ctx);
  const size_t count = optimizer.get("group_count", optimizer->group_count);
  if (count == 0 || count > run.parameters.tensors.size())
    throw optimizer.error(fmt::format("group_count returned {} for {} parameters; an optimizer "
                                      "has between 1 and one group per parameter", count,
                                      run.parameters.tensors.size()));
  for (size_t g = 0; g < count; ++g) {
    const double lr = optimizer.get("get_lr", optimizer->get_lr, g);
    if (!std::isfinite(lr) || lr < 0)
      throw optimizer.error(
          fmt::format("get_lr({}) returned {}; a learning rate is finite and >= 0", g,
                      text::number(lr)));
    run.parameters.base_lrs.push_back(lr);
  }
}

// The schedule (which learns the planned length) and the loss, and how steps use the loss.
void create_schedule_and_loss(Run& run) {
  const RunConfig& config = run.config;
  Components& c = run.components;
  if (config.lr_scheduler) {
    keel_create_context ctx = context(run, *config.lr_scheduler);
    ctx.total_steps = run.plan.total_steps;
    c.scheduler = create_instance<keel_lr_scheduler>(*config.lr_scheduler->component, ctx);
  }
  c.loss = make_instance<keel_loss>(run, config.loss);
  c.loss_calls = with_batches(c.loss);
  c.eval_metrics = EvalMetrics(c.loss_calls);
  const bool counts = counts_items(c.loss_calls);
  if (config.train.accum_normalization == AccumNorm::kItems && !counts)
    throw c.loss.error("does not report item counts (no count_items), which "
                       "train.accum_normalization = \"items\" needs; hint: use \"mean\" or "
                       "\"auto\"");
  run.plan.items_normalization = counts && config.train.accum_normalization != AccumNorm::kMean;
  run.plan.linear_loss = KEEL_HAS_SLOT(c.model, keel_model, forward_features) &&
                         KEEL_HAS_SLOT(c.loss, keel_loss, compute_linear);
  if (run.plan.linear_loss)
    spdlog::info("{} applies the output layer of {} itself in training steps "
                 "(forward_features, compute_linear): the model's whole output is not built "
                 "there; evaluation calls forward and compute",
                 c.loss.label(), c.model.label());
  if (config.train.precision == Precision::kFp16) run.plan.scaler.emplace();
}

// The gradient clipper, the MFU calculator and the profiler (each optional).
void create_measurements(Run& run) {
  const RunConfig& config = run.config;
  Components& c = run.components;
  if (config.grad_clipper) {
    c.clipper = create_instance<keel_grad_clipper>(*config.grad_clipper->component,
                                                   update_context(run, *config.grad_clipper));
    // A clipper of an older ABI would take the norm of this rank's shards as the whole norm.
    if (run.shards && c.clipper.abi_minor() < 7)
      throw c.clipper.error(
          fmt::format("was built for plugin ABI 1.{}, before sharded parameters (1.7): it would "
                      "clip by the norm of this rank's shards only, not the whole gradient's; "
                      "hint: rebuild it against this keel's SDK and combine its norm with "
                      "keel_create_context.shards, or set distributed.shard = \"none\"",
                      c.clipper.abi_minor()));
  }
  if (config.mfu) {
    // The parameters too (deduplicated): a calculator may derive FLOPs from their count.
    c.mfu = create_instance<keel_mfu>(*config.mfu->component, param_context(run, *config.mfu));
    if (KEEL_HAS_SLOT(c.mfu, keel_mfu, peak_flops)) {
      run.plan.mfu_peak = c.mfu.get("peak_flops", c.mfu->peak_flops);
      if (!std::isfinite(run.plan.mfu_peak) || run.plan.mfu_peak <= 0)
        throw c.mfu.error("peak_flops returned " + text::number(run.plan.mfu_peak) +
                          "; a peak is a finite FLOP/s value > 0");
    }
  }
  if (config.profiler) c.profiler = make_instance<keel_profiler>(run, *config.profiler);
}

// Hooks in call order (ascending priority, ties in manifest order), and their checkpointed
// state, keyed by label.
void create_hooks(Run& run) {
  std::vector<const ComponentSpec*> order;
  for (const auto& h : run.config.hooks) order.push_back(&h);
  std::stable_sort(order.begin(), order.end(), [](const ComponentSpec* a, const ComponentSpec* b) {
    return a->priority < b->priority;
  });
  Parameters& p = run.parameters;
  std::map<std::string, std::string> stateful_labels;  // label -> section
  const keel_host* named = hook_host(run.config.hooks);  // log lines name hooks by label
  for (const ComponentSpec* h : order) {
    keel_create_context ctx = context(run, *h);
    ctx.host = named;
    run.components.hooks.push_back(create_instance<keel_hook>(*h->component, ctx));
    const auto& hook = run.components.hooks.back();
    if (hook.extension(KEEL_EXT_HOOK_MODEL)) {  // a hook that reads the model
      if (!run.components.model_views)
        run.components.model_views = std::make_unique<ModelViews>(p.model_state, p.tensors);
      run.components.model_views->attach(hook, run.residency ? "parameters" : "");
    }
    if (!KEEL_HAS_SLOT(hook, keel_hook, state_count) || !KEEL_HAS_SLOT(hook, keel_hook, state))
      continue;
    const size_t n = hook.get("state_count", hook->state_count);
    if (n == 0) continue;
    // State is keyed by the hook's label (default: its type), not its position.
    if (!stateful_labels.emplace(h->label, h->section).second)
      throw Error("[" + h->section + "] and [" + stateful_labels[h->label] + "] both keep state "
                  "in checkpoints under the label '" + h->label + "'; hint: give each a distinct "
                  "label = \"...\" in its [[hooks]] table");
    for (size_t i = 0; i < n; ++i) {
      const keel_named_tensor nt = named_entry(hook, "state", hook->state, i);
      p.hook_state_names.push_back(h->label + "." + nt.name);
      p.hook_state_labels.push_back(h->label);
      p.hook_state.push_back(nt);
    }
  }
  for (size_t i = 0; i < p.hook_state.size(); ++i)
    p.hook_state[i].name = p.hook_state_names[i].c_str();
  for (const auto& hook : run.components.hooks) run.components.observers.add(hook);
}

// The checkpoint backend and store, then what the run starts from: the resume checkpoint, or
// init_from's weights (CHECKPOINT_LOADED).
void create_checkpointing(Run& run, bool validate_only) {
  const RunConfig& config = run.config;
  Components& c = run.components;
  if (!config.checkpoint) return;
  c.checkpoint = make_instance<keel_checkpoint>(run, *config.checkpoint);
  c.backend.emplace(c.checkpoint);
  const std::string root = (run.directory.path / "checkpoints").string();
  c.store = std::make_unique<CheckpointStore>(root, &*c.backend, config.checkpointing, run.run_id);
  if (!validate_only && run.ranks.rank == 0 && c.store->remove_stale() > 0)
    spdlog::info("removed what interrupted checkpoint saves left in {}", root);
  if (run.resume.active()) {
    load_resume_point(run);
    spdlog::info("{} from {} (step {}, epoch {}, batch {} of that epoch)",
                 validate_only ? "would resume" : "resuming", run.resume.dir,
                 run.resume.meta.step, run.resume.meta.epoch, run.resume.meta.epoch_batches);
    if (!validate_only)
      emit(run, KEEL_EVENT_CHECKPOINT_LOADED, nullptr, nullptr, run.resume.dir.c_str());
  } else if (!config.checkpointing.init_from.empty()) {
    load_init_from(run);
    if (!validate_only)
      emit(run, KEEL_EVENT_CHECKPOINT_LOADED, nullptr, nullptr, config.checkpointing.init_from.c_str());
  }
}

// Several ranks: every rank starts from rank 0's parameters and buffers (DDP's broadcast at
// start), and gradients are all-reduced from here on (reduce-scattered with shard = "gradients").
void share_model_across_ranks(Run& run) {
  if (!run.ranks.group) return;
  ProcessGroup& group = *run.ranks.group;
  std::vector<at::Tensor> state;
  for (const auto& nt : run.parameters.model_state) state.push_back(borrow(nt.tensor));
  group.verify_same(state, "the model's parameters and buffers");
  group.broadcast(state, "broadcasting the model from rank 0");
  // shard = "gradients": the shards reduce-scatter the gradients instead.
  if (!run.shards || !run.shards->reduces_gradients()) {
    const std::vector<std::string> names(run.parameters.names.begin(),
                                         run.parameters.names.end());
    run.grad_sync = std::make_unique<GradSync>(group, run.parameters.tensors, names);
    spdlog::info("gradients all-reduced in {}", run.grad_sync->describe());
  }
  // Ranks other than 0 draw their own random numbers from here on (dropout, ...).
  if (run.ranks.rank > 0 && !run.resume.active())
    at::manual_seed(run.config.run.seed + 1000003ull * static_cast<uint64_t>(run.ranks.rank));
}

}  // namespace

void assemble(Run& run, const RunConfig& config, bool validate_only,
              const std::optional<Launch>& launch) {
  run.config = config;
  join_ranks(run, launch);
  // `keel validate` runs alone (no process group); under a launcher it checks global_batch
  // against the launcher's number of ranks.
  const std::optional<Launch> launched =
      validate_only && config.train.global_batch > 0 ? detect_launch() : std::nullopt;
  run.plan.grad_accum =
      micro_batches_per_step(config, launched ? launched->world_size : run.ranks.world);
  open_run_directory(run, validate_only);
  run.run_id = on_rank0(run.ranks.group.get(), run.ranks.rank, "choose the run id",
                        [] { return random_token(); });
  if (config.resume != RunConfig::Resume::kNo) choose_resume_point(run);
  create_model(run);
  shard_parameters(run);
  create_data(run);
  create_optimizer(run);
  create_sparse_optimizer(run);
  create_schedule_and_loss(run);
  create_measurements(run);
  create_hooks(run);
  run.progress.struct_size = sizeof(run.progress);
  run.progress.max_steps = run.plan.total_steps;
  run.progress.epochs = config.train.epochs;
  run.progress.grad_norm = NAN;
  create_checkpointing(run, validate_only);
  create_own_step(run);  // [models.NAME] read init_from with the checkpoint backend
  if (validate_only) {
    check_run_files(run.directory);  // what start_run_log would refuse
    return;
  }
  share_model_across_ranks(run);
  // shard = "parameters": every rank's rows into its shards, the whole parameters freed.
  if (run.residency) run.residency->start();
  run.step_modes = choose_step_modes(run);  // what each step adds to the plain one
  if (run.ranks.rank == 0)  // rank 0 writes the run directory's files
    start_run_log(run.directory, config, run.resolved_manifest, run.run_id);
}

}  // namespace keel
