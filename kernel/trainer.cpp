#include "trainer.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>  // includes <ATen/ATen.h>
#include <ATen/core/Tensor.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/empty.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <sstream>
#include <regex>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "blas.hpp"
#include "checkpoint/durable.hpp"
#include "checkpoint/resume.hpp"
#include "checkpoint/store.hpp"
#include "components.hpp"
#include "distributed/grad_sync.hpp"
#include "distributed/launch.hpp"
#include "distributed/process_group.hpp"
#include "error.hpp"
#include "host.hpp"
#include "loader/bounded.hpp"
#include "keel/tensor.hpp"
#include "log.hpp"
#include "loss_scaler.hpp"
#include "run_dir.hpp"

namespace fs = std::filesystem;

namespace keel {

using Clock = std::chrono::steady_clock;

void configure_threads(int64_t threads, int local_processes) {
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t n = threads > 0 ? threads : std::max<int64_t>(1, cores / std::max(1, local_processes));
  at::set_num_threads(static_cast<int>(n));
  const int blas_threads = blas_threads_for(static_cast<int>(n));  // one pool: see blas.hpp
  if (blas_threads > 0) set_blas_threads(blas_threads);
  spdlog::debug("{} LibTorch intra-op thread(s) ({} core(s), {} process(es) on this machine); "
                "BLAS: {}", n, cores, std::max(1, local_processes), blas_line(blas_threads));
}

void configure_allocator() {
  // Large tensors (activations, gradients, im2col buffers) are freed and allocated again every
  // step. By default glibc hands blocks above its (dynamic) mmap threshold back to the kernel
  // on free and trims the heap, so every step page-faults them in afresh: 8160 faults/step and
  // 95 ms/step for an MLP 784-2048-2048-10 at batch 256, against 127 faults and 85 ms/step with
  // these settings (bench/bench_vs_python.py). Keep such blocks in the heap instead: the mmap
  // threshold at glibc's 64-bit maximum (32 MiB) and no trimming below 1 GiB of free heap.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

void apply_process_settings(const RunConfig& config) {
  const std::optional<Launch> launch = detect_launch();
  configure_threads(config.threads, launch ? launch->local_world_size : 1);
  if (config.malloc_tuning) configure_allocator();
  at::manual_seed(config.seed);
}

namespace {

std::string shape_text(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string shape_of(const at::Tensor& t) { return shape_text(t.sizes()); }

std::string num(double v) { return std::isnan(v) ? "nan" : fmt::format("{}", v); }

// The current UTC time: "20261126T004105Z" (compact, for names) or "2026-11-26 00:41:05 UTC".
std::string utc_stamp(bool compact) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, compact ? "%Y%m%dT%H%M%SZ" : "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// The files by which run directory `dir` shows that an earlier run wrote it, comma-separated
// ("" when none): manifest.resolved.toml, plugins.json and metrics.jsonl (the jsonl sink's
// default name), and checkpoints/step-<N> directories.
std::string earlier_records(const RunDir& dir) {
  std::string found;
  for (const char* name : {"manifest.resolved.toml", "plugins.json", "metrics.jsonl"})
    if (dir.has(name)) found += (found.empty() ? "" : ", ") + std::string(name);
  size_t steps = 0;
  for (const std::string& name : dir.entries("checkpoints")) steps += name.rfind("step-", 0) == 0;
  if (steps > 0)
    found += (found.empty() ? "" : ", ") + std::to_string(steps) + " checkpoint" +
             (steps > 1 ? "s" : "") + " in checkpoints/";
  return found;
}

[[noreturn]] void refuse_earlier_records(const std::string& dir, const std::string& records) {
  throw Error("run directory " + dir + " holds an earlier run's records (" + records +
              "), which a new run would overwrite; hint: continue that run with --resume, "
              "choose another output_dir (--set run.output_dir=DIR), or start a new run over "
              "them with --overwrite");
}

// LibTorch errors raised while the kernel works on what a plugin returned: rethrown as
// keel::Error naming the component and the step, never as raw LibTorch text alone.
template <class F>
auto naming(const std::string& who, const char* what, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error& e) {
    throw Error(who + ": " + what + " failed: " + e.what_without_backtrace());
  }
}

// Entry `i` of a model's or hook's named tensors (param, state), checked: a name and a tensor.
template <class Abi>
keel_named_tensor named_entry(const Instance<Abi>& inst, const char* slot_name,
                              keel_status (*slot)(void*, size_t, const char**, keel_tensor**,
                                                  keel_error*),
                              size_t i) {
  keel_named_tensor nt{};
  inst.call(slot_name, slot, i, &nt.name, &nt.tensor);
  if (!nt.name || !*nt.name || !nt.tensor)
    throw inst.error(std::string(slot_name) + "(" + std::to_string(i) + ") returned a NULL " +
                     (nt.tensor ? "or empty name" : "tensor"));
  if (!terminated_within(nt.name, KEEL_NAME_CAPACITY))
    throw inst.error(std::string(slot_name) + "(" + std::to_string(i) + ") returned a name that "
                     "does not end within " + std::to_string(KEEL_NAME_CAPACITY - 1) +
                     " bytes (\"" + bounded(nt.name, 40) + "...\")");
  return nt;
}

// Autocast for the forward pass and the loss (master weights stay fp32): bf16 on the run's
// device (CPU or CUDA autocast), fp16 on CUDA (with the loss scaler); nothing for fp32.
class Autocast {
 public:
  Autocast(Precision precision, const at::Device& device)
      : on_(precision != Precision::kFp32), cuda_(device.is_cuda()) {
    if (!on_) return;
    const at::ScalarType type = precision == Precision::kFp16 ? at::kHalf : at::kBFloat16;
    if (cuda_) {
      prev_enabled_ = at::autocast::is_enabled();
      prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
      at::autocast::set_enabled(true);
      at::autocast::set_autocast_gpu_dtype(type);
    } else {
      prev_enabled_ = at::autocast::is_cpu_enabled();
      prev_dtype_ = at::autocast::get_autocast_cpu_dtype();
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(type);
    }
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    if (cuda_) {
      at::autocast::set_enabled(prev_enabled_);
      at::autocast::set_autocast_gpu_dtype(prev_dtype_);
    } else {
      at::autocast::set_cpu_enabled(prev_enabled_);
      at::autocast::set_autocast_cpu_dtype(prev_dtype_);
    }
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool on_, cuda_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

// SIGTERM / SIGINT: the first one asks the loop to stop after the current step (saving a
// checkpoint); a second one ends the process at once with 128 + its number.
std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  if (!g_stop_signal.compare_exchange_strong(expected, sig)) _exit(128 + sig);
  static const char msg[] =
      "keel: signal received, stopping after the current step (again to exit at once)\n";
  (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
}

// Installs the handlers for the life of a training run, and restores the previous ones.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term_);
    sigaction(SIGINT, &sa, &old_int_);
  }
  ~StopSignals() {
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGINT, &old_int_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_term_ {}, old_int_ {};
};

// keel_state_writer of one state_save call: collects the entries, remembers a refusal.
struct StateWriter {
  keel_state_writer abi{};
  TensorList entries;
  std::set<std::string> names;
  std::string refusal;

  StateWriter() {
    abi.struct_size = sizeof(abi);
    abi.host_data = this;
    abi.put = &put;
  }
  static int put(keel_state_writer* w, const char* name, keel_tensor* tensor) {
    auto* self = static_cast<StateWriter*>(w->host_data);
    const size_t n = name ? strnlen(name, KEEL_NAME_CAPACITY) : 0;
    const std::string shown = n ? std::string(name, n) : std::string();
    if (n == 0) return self->refuse("an entry with a NULL or empty name");
    if (n == KEEL_NAME_CAPACITY)
      return self->refuse("entry '" + shown.substr(0, 40) + "...': the name is longer than " +
                          std::to_string(KEEL_NAME_CAPACITY - 1) + " bytes");
    if (tensor == nullptr) return self->refuse("entry '" + shown + "' has a NULL tensor");
    const at::Tensor t = borrow(tensor);
    if (dtype_of_name(dtype_name(t.scalar_type())) == at::ScalarType::Undefined)
      return self->refuse("entry '" + shown + "' has dtype " + dtype_name(t.scalar_type()) +
                          ", which checkpoints cannot hold");
    if (!self->names.insert(shown).second)
      return self->refuse("entry '" + shown + "' was put twice");
    self->entries.emplace_back(shown, t.detach());
    return 1;
  }
  int refuse(std::string why) {
    if (refusal.empty()) refusal = std::move(why);
    return 0;
  }
};

// The entries of a component's state_save.
template <class Abi>
TensorList save_state(const Instance<Abi>& inst) {
  StateWriter w;
  try {
    inst.call("state_save", inst->state_save, &w.abi);
  } catch (const Error&) {
    if (w.refusal.empty()) throw;
    throw inst.error("state_save failed: " + w.refusal);
  }
  if (!w.refusal.empty()) throw inst.error("state_save: " + w.refusal);
  return std::move(w.entries);
}

// Empty tensors shaped as a commit record's index of object `stem`, to load into.
TensorList allocate(const CommitRecord& record, const std::string& stem) {
  TensorList out;
  auto it = record.tensors.find(stem);
  if (it == record.tensors.end()) return out;
  for (const auto& t : it->second) {
    const at::ScalarType type = dtype_of_name(t.dtype);
    if (type == at::ScalarType::Undefined)
      throw Error("checkpoint tensor '" + t.name + "' has unknown dtype '" + t.dtype + "'");
    out.emplace_back(t.name, at::empty(t.shape, at::TensorOptions().dtype(type)));
  }
  return out;
}

std::vector<keel_named_tensor> as_named(const TensorList& list) {
  std::vector<keel_named_tensor> out;
  for (const auto& [name, t] : list) out.push_back({name.c_str(), peek(t)});
  return out;
}

// [run] device as a LibTorch device: "cuda" is the GPU of the launcher's LOCAL_RANK (0 when
// running alone), "auto" that GPU when CUDA is available, else the CPU.
at::Device resolve_device(const std::string& name, int local_rank) {
  if (name == "cpu" || (name == "auto" && !at::hasCUDA())) return at::Device(at::kCPU);
  const int index = name.rfind("cuda:", 0) == 0 ? std::stoi(name.substr(5)) : local_rank;
  if (!at::hasCUDA())
    throw Error("run.device = \"" + name + "\": CUDA is not available to this process; hint: use "
                "device = \"cpu\" or \"auto\"");
  const int count = at::detail::getCUDAHooks().getNumGPUs();
  if (index >= count)
    throw Error("run.device = \"" + name + "\" means CUDA device " + std::to_string(index) +
                ", and this machine has " + std::to_string(count) + "; hint: one process per "
                "GPU (torchrun --nproc_per_node=" + std::to_string(count) + "), or name a device "
                "below " + std::to_string(count));
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

struct MicroBatch {
  at::Tensor inputs, targets;
  int64_t samples = 0, tokens = 0;
};

// The index in `ts` of a tensor that is `t` (the same TensorImpl, or a view of the same
// storage with the same offset, sizes, strides and dtype), or -1.
int64_t same_tensor_as(const std::vector<at::Tensor>& ts, const at::Tensor& t) {
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& u = ts[i];
    if (u.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return static_cast<int64_t>(i);
    if (u.has_storage() && t.has_storage() && u.storage().is_alias_of(t.storage()) &&
        u.storage_offset() == t.storage_offset() && u.sizes() == t.sizes() &&
        u.strides() == t.strides() && u.dtype() == t.dtype())
      return static_cast<int64_t>(i);
  }
  return -1;
}

// Adds the seconds from its construction to its destruction to `to`.
class AddElapsed {
 public:
  explicit AddElapsed(double& to) : to_(to) {}
  ~AddElapsed() { to_ += std::chrono::duration<double>(Clock::now() - t0_).count(); }
  AddElapsed(const AddElapsed&) = delete;
  AddElapsed& operator=(const AddElapsed&) = delete;

 private:
  double& to_;
  Clock::time_point t0_ = Clock::now();
};

// Sums over one log_every window.
struct Window {
  double loss = 0, grad_norm = 0, data_s = 0;
  // Evaluation and checkpoint time inside the window: not training, so not in its throughput.
  double eval_s = 0, checkpoint_s = 0;
  int64_t steps = 0, norms = 0, samples = 0, tokens = 0;
  Clock::time_point start = Clock::now();
};

}  // namespace

struct Trainer::State {
  RunConfig cfg;
  fs::path run_dir;
  // Rank 0: the run directory, opened (kernel/run_dir.hpp); its entries' identities when it was
  // opened; what this start created (the Trainer's, for removal when the start fails).
  std::optional<RunDir> dir;
  std::vector<std::pair<dev_t, ino_t>> dir_before;
  CreatedEntries* created = nullptr;
  bool claimed = false;  // a fresh run: manifest.resolved.toml created at the start (O_EXCL)
  bool run_log_attached = false;
  std::string scratch_dir;  // validate_only: the components' run directory, removed at the end

  void setup(const RunConfig& config, bool validate_only, const std::optional<Launch>& launch);
  ~State();

  // Data parallelism (a launcher started several processes; null when running alone). Every
  // decision that changes the sequence of collectives is agreed by all ranks (agree_*).
  std::unique_ptr<ProcessGroup> dist;
  std::unique_ptr<GradSync> grad_sync;
  int rank = 0, world = 1;
  bool events_since_agreement = false;  // hooks ran since requests were last agreed
  at::Device device{at::kCPU};

  Instance<keel_model> model;
  Instance<keel_dataset> train_data, test_data;
  Instance<keel_optimizer> optimizer;
  Instance<keel_lr_scheduler> scheduler;
  Instance<keel_loss> loss;
  Instance<keel_grad_clipper> clipper;
  Instance<keel_mfu> mfu;
  Instance<keel_profiler> profiler;
  Instance<keel_checkpoint> checkpoint;
  std::vector<Instance<keel_hook>> hooks;  // in call order (priority, then manifest order)
  std::unique_ptr<CheckpointStore> store;

  std::vector<keel_tensor*> param_handles;
  std::vector<const char*> param_names;
  std::vector<at::Tensor> params;
  std::vector<keel_named_tensor> model_state, hook_state;
  std::vector<std::string> hook_state_names;
  std::vector<double> base_lrs;
  double flops_per_sample = 0;
  int64_t total_steps = 0;
  double mfu_peak = 0;  // FLOP/s the mfu divides by (keel_mfu.peak_flops), 0: not reported
  bool items_normalization = false;
  // Training steps compute the loss from the model's features and output weight (model
  // forward_features and loss compute_linear, ABI 1.5) instead of forward and compute.
  bool linear_loss = false;
  bool use_scaler = false;
  LossScaler scaler;

  // Checkpoints and resume.
  std::string run_id;          // kept by a resumed run (retention only touches its own)
  std::string resolved_text;   // manifest.resolved.toml
  int64_t epoch_batches = 0;   // micro-batches of the current epoch consumed
  bool epoch_finished = false; // the epoch's end events ran: a save points at the next epoch
  std::string resume_dir;      // the checkpoint this run resumes from ("": a fresh run)
  CommitRecord resume_record;
  CheckpointMeta resumed;
  int stop_signal = 0;         // SIGTERM / SIGINT that stopped the run
  int64_t last_record_step = -1;  // step of the latest "train" record

  // Steps ran since the latest "train" record.
  bool unrecorded_steps() const { return window.steps > 0 && last_record_step != ts.step; }

  keel_trainer_state ts{};
  std::vector<keel_metric> last_train, last_eval;
  std::vector<std::string> metric_keys;  // storage of restored metric keys
  uint32_t requests = 0;  // KEEL_REQUEST_* bits hooks set during the current step
  int64_t last_eval_step = -1, last_saved_step = -1;
  Window window;

  keel_create_context context(const ComponentSpec& spec) const {
    keel_create_context c{};
    c.struct_size = sizeof(c);
    c.host = host();
    c.options = &spec.options;
    c.section = spec.section.c_str();
    c.seed = cfg.seed;
    c.rank = rank;
    c.world_size = world;
    c.run_dir = run_dir.c_str();
    c.resume_step = resume_dir.empty() ? 0 : resumed.step;
    return c;
  }

  // The context of a component that works on the model's parameters (optimizer, clipper).
  keel_create_context param_context(const ComponentSpec& spec) const {
    keel_create_context c = context(spec);
    c.params = param_handles.data();
    c.param_names = param_names.data();
    c.param_count = param_handles.size();
    return c;
  }

  template <class Abi>
  Instance<Abi> make(const ComponentSpec& spec) const {
    return create_instance<Abi>(*spec.component, context(spec));
  }

  // ---- profiler marks (no-ops without a profiler) ----
  void begin(const char* phase) const {
    if (profiler) profiler.get("begin", profiler->begin, phase, ts.step);
  }
  void end(const char* phase) const {
    if (profiler) profiler.get("end", profiler->end, phase, ts.step);
  }

  // ---- hooks ----
  void emit(keel_event_kind kind, const char* split = nullptr,
            const std::vector<keel_metric>* metrics = nullptr, const char* path = nullptr,
            int64_t micro_batch = 0, const char* message = nullptr) {
    if (hooks.empty()) return;
    events_since_agreement = true;
    begin("hooks");
    // A hook hears only the events of its plugin's ABI minor (abi.h: 1.0 knew kinds 1-10).
    const uint32_t since = kind >= KEEL_EVENT_AFTER_DATA ? 1 : 0;
    for (const auto& h : hooks) {
      if (h.abi_minor() < since) continue;
      keel_event ev{};
      ev.struct_size = sizeof(ev);
      ev.kind = kind;
      ev.state = &ts;
      ev.split = split;
      ev.metrics = metrics ? metrics->data() : nullptr;
      ev.metric_count = metrics ? metrics->size() : 0;
      ev.path = path;
      ev.micro_batch = micro_batch;
      ev.message = message;
      h.call("on_event", h->on_event, &ev);
      constexpr uint32_t kKnown = KEEL_REQUEST_STOP | KEEL_REQUEST_EVAL | KEEL_REQUEST_CHECKPOINT;
      if (ev.requests & ~kKnown)
        throw h.error(fmt::format("on_event set unknown request bits 0x{:x} (known: STOP 0x1, "
                                  "EVAL 0x2, CHECKPOINT 0x4)", ev.requests & ~kKnown));
      requests |= ev.requests;
    }
    end("hooks");
  }

  // ---- learning rate ----
  void set_lr_for(int64_t step) {
    const double f = scheduler ? scheduler.get("factor", scheduler->factor, step) : 1.0;
    if (!std::isfinite(f) || f < 0)
      throw scheduler.error("factor(" + std::to_string(step) + ") returned " + num(f) +
                            "; a schedule must return a finite value >= 0");
    for (size_t g = 0; g < base_lrs.size(); ++g)
      optimizer.get("set_lr", optimizer->set_lr, g, base_lrs[g] * f);
    ts.lr = base_lrs.empty() ? 0 : base_lrs[0] * f;
  }

  // ---- agreement between ranks ----
  // The requests of every rank's hooks, OR'ed, so that all ranks act on the same ones (and
  // run the same collectives), plus the largest stop signal any rank received. Communicates
  // when hooks ran since the last agreement, or `always` (a step's end: a signal may have
  // arrived); `signal` is this rank's. Returns the agreed signal (0: none).
  int agree_requests(int signal, bool always) {
    if (!dist || (!always && !events_since_agreement)) return signal;
    events_since_agreement = false;
    const auto bit = [&](uint32_t b) { return (requests & b) ? 1.0 : 0.0; };
    const std::vector<double> v = dist->max(
        {bit(KEEL_REQUEST_STOP), bit(KEEL_REQUEST_EVAL), bit(KEEL_REQUEST_CHECKPOINT),
         static_cast<double>(signal)},
        "agreeing on hook requests at step " + std::to_string(ts.step));
    requests = (v[0] > 0 ? KEEL_REQUEST_STOP : 0u) | (v[1] > 0 ? KEEL_REQUEST_EVAL : 0u) |
               (v[2] > 0 ? KEEL_REQUEST_CHECKPOINT : 0u);
    return static_cast<int>(v[3]);
  }

  // Runs `body` on rank 0 and returns its result on every rank. When it fails there, the other
  // ranks fail too, naming rank 0, instead of waiting for it.
  std::string on_rank0(const std::string& what, const std::function<std::string()>& body) {
    static const std::string kFailed("\001failed");  // no valid result starts with \001
    if (!dist) return body();
    if (rank != 0) {
      std::string v = dist->share("", what);
      if (v == kFailed) throw Error("rank 0 failed to " + what + " (its log says why)");
      return v;
    }
    std::string v;
    try {
      v = body();
    } catch (...) {
      try {
        dist->share(kFailed, what);
      } catch (const std::exception&) {  // the error that ends the run is body's
      }
      throw;
    }
    return dist->share(v, what);
  }

  // "rank<r>.<stem>": a checkpoint object of rank r > 0 (rank 0's is plain `stem`).
  std::string rank_object(const std::string& stem) const {
    return rank == 0 ? stem : "rank" + std::to_string(rank) + "." + stem;
  }

  // ---- checkpoints ----
  // Everything a checkpoint holds, gathered now (at a step boundary).
  // With several ranks, rank 0 holds the replicated objects (model, optimizer, hooks) and its
  // own "rng" and "state"; rank r > 0 only its own, as "rank<r>.rng" and "rank<r>.state".
  Snapshot snapshot() {
    Snapshot snap;
    TensorList model_t, hooks_t, rng_t, state_t;
    // Parameters and optimizer state change only in the optimizer step: an asynchronous save
    // copies them on its thread while the next step's forward and backward run (the step waits
    // for that copy before BEFORE_OPTIMIZER_STEP).
    if (rank == 0) {
      const std::set<const void*> params_set(param_handles.begin(), param_handles.end());
      for (const auto& nt : model_state) {
        model_t.emplace_back(nt.name, borrow(nt.tensor));
        if (params_set.count(nt.tensor)) snap.deferred.insert(nt.tensor);
      }
      snap.objects.emplace_back("model", std::move(model_t));
      if (KEEL_HAS_SLOT(optimizer, keel_optimizer, state_save)) {
        TensorList opt = save_state(optimizer);
        for (const auto& [name, t] : opt) snap.deferred.insert(t.unsafeGetTensorImpl());
        snap.objects.emplace_back("optimizer", std::move(opt));
      }
      for (const auto& nt : hook_state) hooks_t.emplace_back(nt.name, borrow(nt.tensor));
      snap.objects.emplace_back("hooks", std::move(hooks_t));
    }
    rng_t.emplace_back("torch.cpu", at::detail::getDefaultCPUGenerator().get_state());
    if (at::hasCUDA())
      for (int d = 0; d < at::detail::getCUDAHooks().getNumGPUs(); ++d)
        rng_t.emplace_back("torch.cuda." + std::to_string(d),
                           at::detail::getCUDAHooks().getDefaultCUDAGenerator(d).get_state());
    snap.objects.emplace_back(rank_object("rng"), std::move(rng_t));
    // Plugins' own state (state_save of the model and the training data), "<section>/<name>".
    const auto add_state = [&](const auto& inst, const std::string& section) {
      using Abi = std::remove_pointer_t<decltype(inst.operator->())>;
      if (!KEEL_HAS_SLOT(inst, Abi, state_save)) return;
      for (auto& [name, t] : save_state(inst)) state_t.emplace_back(section + "/" + name, t);
    };
    add_state(model, "model");
    add_state(train_data, "data.train");
    snap.objects.emplace_back(rank_object("state"), std::move(state_t));
    // Backends take CPU tensors: a synchronous save copies device tensors now (an asynchronous
    // one copies every tensor to the CPU itself).
    if (!device.is_cpu() && !cfg.checkpoint_async)
      for (auto& [stem, tensors] : snap.objects)
        for (auto& [name, t] : tensors) t = t.cpu();

    CheckpointMeta& m = snap.meta;
    m.run_id = run_id;
    m.step = ts.step;
    m.epoch = epoch_finished ? ts.epoch + 1 : ts.epoch;
    m.epoch_batches = epoch_finished ? 0 : epoch_batches;
    m.samples = ts.samples;
    m.tokens = ts.tokens;
    m.skipped_steps = ts.skipped_steps;
    m.last_eval_step = last_eval_step;
    m.world_size = world;
    m.keel_version = KEEL_VERSION;
    m.manifest_hash = hash_string(hash_text(resolved_text));
    m.loss_scale = use_scaler ? scaler.scale() : 0.0;
    m.loss_scale_clean_steps = use_scaler ? scaler.clean_steps() : 0;
    m.window = {window.loss, window.grad_norm, window.steps, window.norms, window.samples,
                window.tokens};
    m.plugins = plugin_versions();
    for (const auto& r : last_train) m.train_metrics.emplace_back(r.key, r.value);
    for (const auto& r : last_eval) m.eval_metrics.emplace_back(r.key, r.value);
    for (const auto& [k, v] : m.train_metrics) snap.metrics["train." + k] = v;
    for (const auto& [k, v] : m.eval_metrics) snap.metrics["test." + k] = v;
    snap.manifest = resolved_text;
    return snap;
  }

  // Name and version of the plugin of every component, once each.
  std::vector<std::pair<std::string, std::string>> plugin_versions() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const ComponentSpec* sp : used_components(cfg)) {
      const LoadedPlugin* pl = sp->component->plugin;
      const std::pair<std::string, std::string> pv{pl->name, pl->version};
      if (std::none_of(out.begin(), out.end(), [&](const auto& o) { return o.first == pv.first; }))
        out.push_back(pv);
    }
    return out;
  }

  void save_checkpoint() {
    const AddElapsed timed(window.checkpoint_s);
    begin("checkpoint");
    finish_async_save(/*block=*/true);  // at most one in flight
    Snapshot snap = snapshot();
    last_saved_step = ts.step;
    if (cfg.checkpoint_async) {
      store->save_async(std::move(snap));
      end("checkpoint");
      spdlog::debug("checkpoint of step {} being written in the background", ts.step);
      return;
    }
    const std::string dir = dist ? save_together(snap) : store->save(snap);
    end("checkpoint");
    committed(dir);
  }

  // A checkpoint of several ranks: rank 0 creates the staging directory and shares its path,
  // every rank writes its objects into it, all agree that every part was written, then rank 0
  // checksums everything, writes the commit record, commits, and shares the committed
  // directory. A failure on any rank fails the save (and the run) on every rank.
  std::string save_together(const Snapshot& snap) {
    const std::string at = " the checkpoint of step " + std::to_string(ts.step);
    if (rank != 0) {
      const std::string staging = dist->share("", "sharing the staging directory of" + at);
      std::string index, failure;
      if (!staging.empty()) {
        try {
          CommitRecord part;
          part.tensors = store->write_part(staging, snap.objects);
          index = write_commit_record(part);
        } catch (const std::exception& e) {  // reported after the agreement, not instead of it
          failure = e.what();
        }
      }
      dist->gather(index, "collecting the parts of" + at);
      if (!dist->all(!staging.empty() && failure.empty(), "agreeing on the parts of" + at))
        throw Error(failure.empty() ? "another rank failed to write its part of" + at +
                                          " (its log says why); nothing was committed"
                                    : failure);
      const std::string dir = dist->share("", "committing" + at);
      if (dir.empty()) throw Error("rank 0 failed to commit" + at + " (its log says why)");
      return dir;
    }
    enum { kStart, kStaged, kAgreed, kRefused } phase = kStart;
    SaveParts parts;
    parts.staged = [&](const std::string& staging) {
      dist->share(staging, "sharing the staging directory of" + at);
      phase = kStaged;
    };
    parts.written = [&] {
      const std::vector<std::string> indexes = dist->gather("", "collecting the parts of" + at);
      phase = kRefused;
      if (!dist->all(true, "agreeing on the parts of" + at))
        throw Error("another rank failed to write its part of" + at +
                    " (its log says why); nothing was committed");
      phase = kAgreed;
      TensorIndex all;
      for (size_t r = 1; r < indexes.size(); ++r)
        for (auto& [stem, index] :
             read_commit_record(indexes[r], "the index of rank " + std::to_string(r)).tensors)
          all[stem] = std::move(index);
      return all;
    };
    std::string dir;
    try {
      dir = store->save(snap, parts);
    } catch (...) {
      try {  // let the other ranks fail now rather than wait for the timeout
        if (phase == kStart) dist->share("", "sharing the staging directory of" + at);
        if (phase == kStart || phase == kStaged) {
          dist->gather("", "collecting the parts of" + at);
          dist->all(false, "agreeing on the parts of" + at);
        }
        if (phase == kAgreed) dist->share("", "committing" + at);
      } catch (const std::exception&) {  // the error that ends the run is the save's
      }
      throw;
    }
    return dist->share(dir, "committing" + at);
  }

  // ---- resume ----
  // `keel train --resume [PATH]`: the checkpoint to continue from, verified, and its manifest
  // compared with this run's. Runs before any component is created.
  void pick_resume_checkpoint() {
    if (!cfg.checkpoint)
      throw Error("--resume: the manifest has no [checkpoint] table, so this run keeps no "
                  "checkpoints to resume from; hint: add [checkpoint] with type = \"safetensors\"");
    const fs::path root = fs::path(cfg.output_dir) / "checkpoints";
    if (cfg.resume == RunConfig::Resume::kPath) {
      const std::string dir = fs::absolute(cfg.resume_path).lexically_normal().string();
      if (!fs::is_directory(dir))
        throw Error("--resume " + cfg.resume_path + ": not a directory; hint: name a checkpoint "
                    "directory (runs/<name>/checkpoints/step-<N>), or give --resume alone for the "
                    "newest one in " + root.string());
      try {
        resume_record = verify_checkpoint(dir);
      } catch (const Error& e) {
        throw Error("--resume " + cfg.resume_path + ": cannot resume from it: " + e.what());
      }
      resume_dir = dir;
    } else {
      auto entries = CheckpointStore::list(root.string());
      for (auto it = entries.rbegin(); it != entries.rend() && resume_dir.empty(); ++it) {
        try {
          resume_record = verify_checkpoint(it->dir);
          resume_dir = it->dir;
        } catch (const Error& e) {
          spdlog::warn("--resume: skipping {}: {}", it->dir, e.what());
        }
      }
      if (resume_dir.empty()) {
        spdlog::info("--resume: no complete checkpoint in {}: starting a fresh run",
                     root.string());
        return;
      }
    }
    adopt_resume_checkpoint();
  }

  // The checkpoint rank 0 chose (and verified) to resume from, on the other ranks.
  void follow_resume_checkpoint(const std::string& dir) {
    if (dir.empty()) return;
    resume_dir = dir;
    resume_record = read_commit_file(dir);
    adopt_resume_checkpoint();
  }

  // Reads the metadata of resume_dir and checks that this run can continue it.
  void adopt_resume_checkpoint() {
    const fs::path meta_path = fs::path(resume_dir) / "trainer_state.toml";
    resumed = read_checkpoint_meta(read_file(meta_path.string()), meta_path.string());
    if (resumed.step != resume_record.step || resumed.run_id != resume_record.run_id)
      throw Error(meta_path.string() + ": step and run_id differ from its commit record; hint: "
                  "the checkpoint is damaged, resume from another one");
    run_id = resumed.run_id;
    if (resumed.world_size != world)
      throw Error("--resume: " + resume_dir + " was saved by " +
                  std::to_string(resumed.world_size) + " process(es) and this run has " +
                  std::to_string(world) + "; each rank's generator and data position are in "
                  "it, so only the same number continues it exactly; hint: launch " +
                  std::to_string(resumed.world_size) + " process(es) (torchrun "
                  "--nproc_per_node=" + std::to_string(resumed.world_size) + "), or start a "
                  "new run from its weights with [checkpoint] init_from");
    check_manifest_changes(read_file((fs::path(resume_dir) / "manifest.resolved.toml").string()));
    const auto now = plugin_versions();
    for (const auto& [name, version] : resumed.plugins)
      for (const auto& [n, v] : now)
        if (n == name && v != version)
          spdlog::warn("--resume: plugin {} was version {} when {} was saved, it is {} now",
                       name, version, resume_dir, v);
  }

  void check_manifest_changes(const std::string& saved) {
    std::vector<ManifestChange> breaking;
    for (const ManifestChange& c : manifest_changes(saved, resolved_text)) {
      if (c.harmless)
        spdlog::warn("--resume: {} changed since the checkpoint ({} -> {})", c.key, c.before,
                     c.after);
      else
        breaking.push_back(c);
    }
    if (breaking.empty()) return;
    if (cfg.resume_changed) {
      for (const ManifestChange& c : breaking)
        spdlog::warn("--resume: {} changed since the checkpoint ({} -> {}), accepted by "
                     "--resume-changed: the run no longer continues exactly",
                     c.key, c.before, c.after);
      return;
    }
    std::string more;
    for (size_t i = 1; i < breaking.size(); ++i) more += (i > 1 ? ", " : "") + breaking[i].key;
    const ManifestChange& c = breaking.front();
    throw Error("--resume: " + c.key + " changed since the checkpoint " + resume_dir + " (" +
                c.before + " -> " + c.after + ")" +
                (more.empty() ? "" : "; also changed: " + more) +
                ". That breaks an exact continuation; hint: set it back, or add --resume-changed "
                "to accept the change");
  }

  // The model's tensors against a checkpoint's index: every one present with its shape.
  void check_model_tensors(const CommitRecord& rec, const std::string& dir,
                           const TensorList& into, const std::string& hint) const {
    auto it = rec.tensors.find("model");
    if (it == rec.tensors.end())
      throw Error(dir + ": the checkpoint holds no model; hint: it was not written by keel train");
    std::map<std::string, const CommitRecord::Tensor*> stored;
    for (const auto& t : it->second) stored[t.name] = &t;
    for (const auto& [name, t] : into) {
      auto s = stored.find(name);
      if (s == stored.end())
        throw Error(dir + ": the checkpoint has no tensor '" + name + "' for " + model.label() +
                    "; hint: " + hint);
      if (s->second->shape != t.sizes().vec())
        throw Error(dir + ": tensor '" + name + "' has shape " + shape_text(s->second->shape) +
                    " in the checkpoint and " + shape_of(t) + " in " +
                    model.label() + "; hint: " + hint);
    }
  }

  // Hook state by label: what the checkpoint and this run's hooks share is loaded; the rest is
  // named in a warning.
  void load_hook_state(const CommitRecord& rec, const std::string& dir) {
    std::set<std::string> stored;
    if (auto it = rec.tensors.find("hooks"); it != rec.tensors.end())
      for (const auto& t : it->second) stored.insert(t.name);
    TensorList into;
    std::set<std::string> mine;
    for (const auto& nt : hook_state) {
      mine.insert(nt.name);
      if (stored.count(nt.name))
        into.emplace_back(nt.name, borrow(nt.tensor));
      else
        spdlog::warn("hook state '{}' is not in {}: that hook starts afresh", nt.name, dir);
    }
    for (const auto& name : stored)
      if (!mine.count(name))
        spdlog::warn("{} holds hook state '{}', which no hook of this run keeps (hooks are matched "
                     "by label): not loaded", dir, name);
    store->load(dir, "hooks", into);
  }

  // Loads everything the resume checkpoint holds into the components created by setup.
  void load_resume_checkpoint() {
    const CommitRecord& rec = resume_record;
    const std::string& dir = resume_dir;
    TensorList model_t;
    for (const auto& nt : model_state) model_t.emplace_back(nt.name, borrow(nt.tensor));
    check_model_tensors(rec, dir, model_t,
                        "resume with the model options the checkpoint was saved with (its "
                        "manifest.resolved.toml)");
    store->load(dir, "model", model_t);

    if (!KEEL_HAS_SLOT(optimizer, keel_optimizer, state_load) ||
        !KEEL_HAS_SLOT(optimizer, keel_optimizer, state_save))
      throw optimizer.error("has no state_save/state_load slots (ABI 1.3), so --resume would "
                            "go on with fresh optimizer moments; hint: use an optimizer that "
                            "keeps its state in checkpoints (sgd, adam, adamw do), or start a "
                            "new run from the weights with [checkpoint] init_from");
    if (!rec.tensors.count("optimizer"))
      throw Error(dir + ": the checkpoint holds no optimizer state (saved by an optimizer "
                  "without state slots); hint: start a new run from its weights with "
                  "[checkpoint] init_from");
    TensorList opt = allocate(rec, "optimizer");
    store->load(dir, "optimizer", opt);
    const auto named = as_named(opt);
    optimizer.call("state_load", optimizer->state_load, named.data(), named.size());

    load_hook_state(rec, dir);

    TensorList plugin_state = allocate(rec, rank_object("state"));
    store->load(dir, rank_object("state"), plugin_state);
    const auto give_state = [&](const auto& inst, const std::string& section) {
      using Abi = std::remove_pointer_t<decltype(inst.operator->())>;
      TensorList mine;
      const std::string prefix = section + "/";
      for (const auto& [name, t] : plugin_state)
        if (name.rfind(prefix, 0) == 0) mine.emplace_back(name.substr(prefix.size()), t);
      if (!KEEL_HAS_SLOT(inst, Abi, state_load)) {
        if (!mine.empty())
          spdlog::warn("{} holds state of {}, which has no state_load slot now: not loaded", dir,
                       inst.label());
        return;
      }
      const auto n = as_named(mine);
      inst.call("state_load", inst->state_load, n.data(), n.size());
    };
    give_state(model, "model");
    give_state(train_data, "data.train");

    TensorList rng = allocate(rec, rank_object("rng"));
    store->load(dir, rank_object("rng"), rng);
    for (const auto& [name, t] : rng) {
      if (name == "torch.cpu") {
        at::Generator gen = at::detail::getDefaultCPUGenerator();
        gen.set_state(t);
      } else if (name.rfind("torch.cuda.", 0) == 0) {
        const int d = std::stoi(name.substr(11));
        if (!at::hasCUDA() || d >= at::detail::getCUDAHooks().getNumGPUs())
          throw Error(dir + ": holds the generator of CUDA device " + std::to_string(d) +
                      ", which this process does not have; hint: resume on the same devices");
        at::Generator gen = at::detail::getCUDAHooks().getDefaultCUDAGenerator(d);
        gen.set_state(t);
      }
    }

    const CheckpointMeta& m = resumed;
    ts.step = m.step;
    ts.epoch = m.epoch;
    ts.samples = m.samples;
    ts.tokens = m.tokens;
    ts.skipped_steps = m.skipped_steps;
    last_eval_step = m.last_eval_step;
    last_saved_step = m.step;
    if (use_scaler && m.loss_scale > 0) scaler.restore(m.loss_scale, m.loss_scale_clean_steps);
    window.loss = m.window.loss;
    window.grad_norm = m.window.grad_norm;
    window.steps = m.window.steps;
    window.norms = m.window.norms;
    window.samples = m.window.samples;
    window.tokens = m.window.tokens;
    metric_keys.clear();
    metric_keys.reserve(m.train_metrics.size() + m.eval_metrics.size());  // no reallocation
    for (const auto& [k, v] : m.train_metrics) {
      metric_keys.push_back(k);
      last_train.push_back({metric_keys.back().c_str(), v});
    }
    for (const auto& [k, v] : m.eval_metrics) {
      metric_keys.push_back(k);
      last_eval.push_back({metric_keys.back().c_str(), v});
    }
    if (!last_train.empty()) {
      ts.train_metrics = last_train.data();
      ts.train_metric_count = last_train.size();
    }
    for (const auto& r : last_train) {
      if (std::strcmp(r.key, "step") == 0) last_record_step = static_cast<int64_t>(r.value);
      if (std::strcmp(r.key, "loss_last") == 0) ts.loss = r.value;
      if (std::strcmp(r.key, "grad_norm_last") == 0) ts.grad_norm = r.value;
    }
    if (!last_eval.empty()) {
      ts.eval_metrics = last_eval.data();
      ts.eval_metric_count = last_eval.size();
    }
  }

  // [checkpoint] init_from: model weights (selected by init_include / init_exclude, names
  // rewritten by init_rename) and hook state; nothing else.
  void warm_start() {
    const std::string& dir = cfg.init_from;
    if (!fs::is_directory(dir))
      throw Error("checkpoint.init_from: '" + dir + "' is not a checkpoint directory; hint: point "
                  "it at runs/<name>/checkpoints/step-<N>");
    std::optional<CommitRecord> rec;
    if (fs::exists(fs::path(dir) / "commit.json")) {
      try {
        rec = verify_checkpoint(dir);
      } catch (const Error& e) {
        throw Error(std::string("checkpoint.init_from: ") + e.what());
      }
    } else {
      // Without a commit record nothing vouches for the files: only the safetensors backend,
      // whose files hold no code and whose reader checks every tensor against the file's size,
      // loads them unless the manifest says init_from_unverified = true.
      const Component* backend = cfg.checkpoint ? cfg.checkpoint->component : nullptr;
      const bool safetensors = backend && backend->name == "safetensors" && backend->plugin &&
                               backend->plugin->name == "keel-safetensors";
      if (!safetensors && !cfg.init_from_unverified)
        throw Error("checkpoint.init_from: '" + dir + "' has no commit record (commit.json: not "
                    "committed by keel), and only the safetensors backend loads such a directory "
                    "unasked, not " + (backend ? backend->label() : std::string("this backend")) +
                    "; hint: if you trust its files, set [checkpoint] init_from_unverified = true "
                    "(or --set checkpoint.init_from_unverified=true)");
      spdlog::warn("checkpoint.init_from: {} has no commit record (not committed by keel): its "
                   "files are loaded unverified", dir);
    }
    const std::regex include(cfg.init_include), exclude(cfg.init_exclude);
    TensorList into;
    std::vector<std::string> kept;
    for (const auto& nt : model_state) {
      const std::string name = nt.name;
      if ((!cfg.init_include.empty() && !std::regex_search(name, include)) ||
          (!cfg.init_exclude.empty() && std::regex_search(name, exclude))) {
        kept.push_back(name);
        continue;
      }
      std::string stored = name;  // the checkpoint's name: init_rename maps it to the model's
      for (const auto& [from, to] : cfg.init_rename)
        if (name.rfind(to, 0) == 0) {
          stored = from + name.substr(to.size());
          break;
        }
      into.emplace_back(stored, borrow(nt.tensor));
    }
    if (into.empty())
      throw Error("checkpoint.init_from: init_include / init_exclude select none of the model's "
                  "tensors; hint: `keel train` logs their names at debug level (--log-level debug)");
    if (rec)
      check_model_tensors(*rec, dir, into,
                          "choose the tensors to load with [checkpoint] init_include / "
                          "init_exclude, and map names with [checkpoint.init_rename]");
    store->load(dir, "model", into);
    spdlog::info("init_from {}: loaded {} model tensor(s), {} kept their initialisation", dir,
                 into.size(), kept.size());
    for (const auto& [name, t] : into) spdlog::debug("  loaded {}", name);
    for (const auto& name : kept) spdlog::debug("  kept {}", name);
    if (rec) load_hook_state(*rec, dir);
  }

  void committed(const std::string& dir) {
    spdlog::info("checkpoint committed: {}", dir);
    emit(KEEL_EVENT_CHECKPOINT_SAVED, nullptr, nullptr, dir.c_str());
  }

  // An asynchronous save that has finished (or, with `block`, the one in flight): its error
  // fails the run here, its commit is announced to the hooks here.
  void finish_async_save(bool block) {
    if (!store || !store->in_flight() || (!block && !store->ready())) return;
    committed(store->wait());
  }

  // A SIGTERM / SIGINT arrived during the step just taken: stop after it, with a checkpoint.
  void stop_for_signal(int sig) {
    if (stop_signal) return;
    stop_signal = sig;
    spdlog::warn("{} received: stopping after step {}{}", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                 ts.step, store ? " and saving a checkpoint" : " (no [checkpoint]: nothing saved)");
    requests |= KEEL_REQUEST_STOP | (store ? KEEL_REQUEST_CHECKPOINT : 0u);
  }

  // Positions the training data at micro-batch `batch` of `epoch` (a resumed run).
  void seek_train_data(int64_t epoch, int64_t batch) {
    if (KEEL_HAS_SLOT(train_data, keel_dataset, seek)) {
      train_data.call("seek", train_data->seek, epoch, batch);
      return;
    }
    spdlog::info("{} has no seek slot: replaying {} batch(es) of epoch {} to reach the resume "
                 "position", train_data.label(), batch, epoch);
    train_data.call("start_epoch", train_data->start_epoch, epoch);
    for (int64_t i = 0; i < batch; ++i) {
      keel_batch b{};
      int has = 0;
      train_data.call("next", train_data->next, &b, &has);
      adopt(b.inputs);
      adopt(b.targets);
      if (!has)
        throw train_data.error("epoch " + std::to_string(epoch) + " ended after " +
                               std::to_string(i) + " batches, but the checkpoint was saved after " +
                               std::to_string(batch) + "; hint: resume with the data options it "
                               "was saved with");
    }
  }

  // ---- data ----
  // Fetches up to grad_accum micro-batches; fewer at the end of an epoch, none when it is over.
  std::vector<MicroBatch> fetch_micro_batches() {
    std::vector<MicroBatch> out;
    const auto t0 = Clock::now();
    begin("data");
    for (int64_t i = 0; i < cfg.grad_accum; ++i) {
      keel_batch b{};
      int has = 0;
      train_data.call("next", train_data->next, &b, &has);
      if (!has) break;
      out.push_back(on_device(checked_batch(train_data, b)));
    }
    end("data");
    if (dist) {
      // Every rank takes as many micro-batches as the rank with the fewest (none: the epoch
      // ends on every rank), so that all run the same gradient all-reduces.
      const size_t fewest = static_cast<size_t>(
          -dist->max({-static_cast<double>(out.size())},
                     "agreeing on the batches of step " + std::to_string(ts.step + 1))[0]);
      if (fewest < out.size()) {
        spdlog::warn("{} has {} more micro-batch(es) in epoch {} than another rank: left out "
                     "(hint: shard the data evenly, e.g. fashion_mnist remainder = \"pad\" or "
                     "\"drop\")", train_data.label(), out.size() - fewest, ts.epoch);
        out.resize(fewest);
      }
    }
    window.data_s += std::chrono::duration<double>(Clock::now() - t0).count();
    return out;
  }

  // The batch on the run's device (the dataset made it on the CPU).
  MicroBatch on_device(MicroBatch mb) const {
    if (device.is_cpu()) return mb;
    mb.inputs = mb.inputs.to(device, /*non_blocking=*/true);
    mb.targets = mb.targets.to(device, /*non_blocking=*/true);
    return mb;
  }

  // A batch from a dataset's `next`, checked: both tensors, samples > 0, tokens >= 0, and the
  // same first (batch) dimension.
  static MicroBatch checked_batch(const Instance<keel_dataset>& data, const keel_batch& b) {
    MicroBatch mb{adopt(b.inputs), adopt(b.targets), b.samples, b.tokens};
    if (!mb.inputs.defined() || !mb.targets.defined())
      throw data.error(std::string("next returned a batch without ") +
                       (mb.inputs.defined() ? "targets" : "inputs") + " (a NULL tensor)");
    if (b.samples <= 0 || b.tokens < 0)
      throw data.error("next returned a batch with samples = " + std::to_string(b.samples) +
                       " and tokens = " + std::to_string(b.tokens) +
                       "; a batch holds samples >= 1 and tokens >= 0");
    if (mb.inputs.dim() == 0 || mb.targets.dim() == 0 ||
        mb.inputs.size(0) != mb.targets.size(0))
      throw data.error("next returned inputs " + shape_of(mb.inputs) + " and targets " +
                       shape_of(mb.targets) +
                       " whose first dimension differs; the first dimension is the batch");
    return mb;
  }

  at::Tensor forward(const at::Tensor& x) const {
    keel_tensor* out = nullptr;
    model.call("forward", model->forward, peek(x), &out);
    at::Tensor y = adopt(out);
    if (!y.defined()) throw model.error("forward returned no tensor (NULL output)");
    if (y.dim() == 0 || y.size(0) != x.size(0))
      throw model.error("forward returned shape " + shape_of(y) + " for inputs " + shape_of(x) +
                        "; its first dimension must be the batch (" +
                        std::to_string(x.size(0)) + ")");
    return y;
  }

  // `training`: the loss must carry a gradient (under autograd).
  at::Tensor compute_loss(const at::Tensor& out, const at::Tensor& y, int64_t* count,
                          bool training) const {
    keel_tensor* l = nullptr;
    *count = -1;
    loss.call("compute", loss->compute, peek(out), peek(y), &l, count);
    return checked_loss(adopt(l), *count, training, "compute");
  }

  // What the loss's `call` (compute or compute_linear) returned, checked.
  at::Tensor checked_loss(at::Tensor v, int64_t count, bool training, const std::string& call) const {
    if (!v.defined()) throw loss.error(call + " returned no loss tensor (NULL)");
    if (v.dim() != 0)
      throw loss.error(call + " returned a tensor of shape " + shape_of(v) +
                       "; expected a scalar loss (a 0-dim tensor, the mean over the batch)");
    if (!v.is_floating_point())
      throw loss.error(call + " returned a loss of dtype " + c10::toString(v.scalar_type()) +
                       "; a loss must be a floating-point tensor");
    if (training && !v.requires_grad())
      throw loss.error(call + " returned a loss that does not require grad, so backward cannot "
                       "reach the model (was it detached, or computed under no_grad?)");
    if (count < 0)
      throw loss.error(call + " reported count = " + std::to_string(count) +
                       "; it must set the number of items it averaged over (>= 0)");
    return v;
  }

  // The loss of a micro-batch from the model's features and output-layer weight (training
  // steps with forward_features and compute_linear): the [batch, ..., V] output is never made
  // whole. The same checks as forward and compute_loss, and the two tensors' shapes.
  at::Tensor linear_loss_of(const at::Tensor& x, const at::Tensor& y, int64_t* count) const {
    keel_tensor* f = nullptr;
    keel_tensor* w = nullptr;
    model.call("forward_features", model->forward_features, peek(x), &f, &w);
    const at::Tensor features = adopt(f), weight = adopt(w);
    if (!features.defined() || !weight.defined())
      throw model.error(std::string("forward_features returned no ") +
                        (features.defined() ? "weight" : "features") + " (a NULL tensor)");
    if (features.dim() < 2 || features.size(0) != x.size(0) || weight.dim() != 2 ||
        weight.size(1) != features.size(-1))
      throw model.error("forward_features returned features " + shape_of(features) +
                        " and weight " + shape_of(weight) + " for inputs " + shape_of(x) +
                        "; expected features [batch (" + std::to_string(x.size(0)) +
                        "), ..., F] and weight [V, F]");
    keel_tensor* l = nullptr;
    *count = -1;
    loss.call("compute_linear", loss->compute_linear, peek(features), peek(weight), peek(y), &l,
              count);
    return checked_loss(adopt(l), *count, true, "compute_linear");
  }

  // Weight of each micro-batch's mean loss in the step's loss: its share of the items when
  // the loss reports item counts (token-normalised accumulation), else 1/k.
  std::vector<double> micro_batch_weights(const std::vector<MicroBatch>& mbs) const {
    std::vector<double> w(mbs.size(), 1.0 / static_cast<double>(mbs.size()));
    if (!items_normalization || mbs.size() == 1) return w;  // one micro-batch: weight 1
    std::vector<int64_t> items;
    int64_t total = 0;
    for (const auto& mb : mbs) {
      items.push_back(loss.get("count_items", loss->count_items, peek(mb.targets)));
      if (items.back() < 0) {
        // "auto": a loss that reports no count for these targets gets the mean (1/k).
        if (cfg.accum_normalization == AccumNorm::kAuto) return w;
        throw loss.error("count_items returned " + std::to_string(items.back()) +
                         " but train.accum_normalization = \"items\" needs item counts; "
                         "hint: use \"mean\" or \"auto\"");
      }
      total += items.back();
    }
    for (size_t i = 0; i < mbs.size(); ++i)
      w[i] = total > 0 ? static_cast<double>(items[i]) / static_cast<double>(total) : 0.0;
    return w;
  }

  // One optimizer step over the given micro-batches. Returns the step's loss.
  double train_step(const std::vector<MicroBatch>& mbs) {
    emit(KEEL_EVENT_STEP_START);
    for (size_t i = 0; i < mbs.size(); ++i)
      emit(KEEL_EVENT_AFTER_DATA, nullptr, nullptr, nullptr, static_cast<int64_t>(i));

    optimizer.get("zero_grad", optimizer->zero_grad);
    const std::vector<double> weights = micro_batch_weights(mbs);
    double step_loss = 0;
    bool finite = true;
    for (size_t i = 0; i < mbs.size(); ++i) {
      // Only the step's last backward all-reduces the gradients (the earlier ones accumulate
      // locally, as under DDP's no_sync).
      const bool sync = grad_sync && i + 1 == mbs.size();
      if (sync) grad_sync->before_forward();
      at::Tensor micro_loss;
      {
        begin("forward");
        Autocast autocast(cfg.precision, device);
        int64_t count = 0;
        micro_loss = linear_loss ? linear_loss_of(mbs[i].inputs, mbs[i].targets, &count)
                                 : compute_loss(forward(mbs[i].inputs), mbs[i].targets, &count, true);
        // A weight of 1 (no accumulation) adds nothing but a node to the autograd graph.
        if (weights[i] != 1.0) micro_loss = micro_loss.mul(weights[i]);
        end("forward");
      }
      const double value = micro_loss.item<double>();
      finite = finite && std::isfinite(value);
      step_loss += value;
      begin("backward");
      if (sync) grad_sync->before_backward(micro_loss);
      // Backward runs the autograd functions of the model's and the loss's operations (and,
      // when synchronising, the gradient all-reduce).
      const auto backward = [&] {
        (use_scaler ? scaler.scale_loss(micro_loss) : micro_loss).backward();
      };
      if (!sync) {
        naming(model.label() + " / " + loss.label(), "backward", backward);
      } else {
        try {
          backward();
        } catch (const c10::Error& e) {
          throw dist->failure("backward of step " + std::to_string(ts.step + 1) + " (" +
                                  model.label() + " / " + loss.label() +
                                  ", with the gradient all-reduce)",
                              e.what_without_backtrace());
        }
      }
      end("backward");
    }
    if (use_scaler) finite = scaler.unscale(params) && finite;
    emit(KEEL_EVENT_AFTER_BACKWARD);

    double norm = NAN;
    if (clipper) {
      begin("clip");
      clipper.call("clip", clipper->clip, &norm);
      end("clip");
      if (norm < 0)  // NaN passes on to the non-finite policy: the gradients may hold NaN
        throw clipper.error("clip reported a negative gradient norm (" + num(norm) +
                            "); the norm before clipping is >= 0");
      finite = finite && std::isfinite(norm);
    }
    ts.grad_norm = norm;
    int64_t step_samples = 0, step_tokens = 0;
    for (const auto& mb : mbs) {
      step_samples += mb.samples;
      step_tokens += mb.tokens;
    }
    if (dist) {
      // One all-reduce: the loss (mean over ranks), whether any rank saw a non-finite value
      // (then every rank skips the step), samples and tokens (sums).
      const std::vector<double> v = dist->sum(
          {step_loss, finite ? 0.0 : 1.0, static_cast<double>(step_samples),
           static_cast<double>(step_tokens)},
          "reducing the loss of step " + std::to_string(ts.step + 1));
      step_loss = v[0] / world;
      finite = v[1] == 0;
      step_samples = static_cast<int64_t>(v[2]);
      step_tokens = static_cast<int64_t>(v[3]);
    }
    if (use_scaler) scaler.update(finite);

    if (finite) {
      if (store) store->wait_copied();  // an asynchronous save's copy of the parameters
      emit(KEEL_EVENT_BEFORE_OPTIMIZER_STEP);
      begin("optimizer");
      optimizer.call("step", optimizer->step);
      end("optimizer");
    } else if (cfg.nonfinite == NonFinite::kError && !use_scaler) {
      throw Error("non-finite " + std::string(std::isfinite(step_loss) ? "gradient norm" : "loss") +
                  " at step " + std::to_string(ts.step + 1) + " (loss " + num(step_loss) +
                  ", grad norm " + num(norm) + "); hint: lower the learning rate, "
                  "clip gradients, or set train.nonfinite = \"skip\"");
    } else {
      ts.skipped_steps += 1;
      spdlog::warn("step {}: non-finite loss or gradients, optimizer step skipped ({} so far)",
                   ts.step + 1, ts.skipped_steps);
      if (!use_scaler && ts.skipped_steps > cfg.max_skips)
        throw Error("more than train.max_skips = " + std::to_string(cfg.max_skips) +
                    " steps skipped for non-finite values (latest at step " +
                    std::to_string(ts.step + 1) + "); hint: lower the learning rate");
    }

    ts.step += 1;
    ts.samples += step_samples;
    ts.tokens += step_tokens;
    window.samples += step_samples;
    window.tokens += step_tokens;
    ts.loss = step_loss;
    window.loss += step_loss;
    window.steps += 1;
    if (std::isfinite(norm)) {
      window.grad_norm += norm;
      window.norms += 1;
    }
    emit(KEEL_EVENT_STEP_END);
    return step_loss;
  }

  void log_train_metrics() {
    // Training time only: the window's wall time less its evaluations and checkpoint saves
    // (reported on their own below), so that throughput and MFU describe training steps.
    double secs = std::chrono::duration<double>(Clock::now() - window.start).count() -
                  window.eval_s - window.checkpoint_s;
    double data_s = window.data_s, eval_s = window.eval_s, checkpoint_s = window.checkpoint_s;
    if (dist) {  // the slowest rank's times
      const std::vector<double> v =
          dist->max({secs, data_s, eval_s, checkpoint_s}, "reducing step times");
      secs = v[0];
      data_s = v[1];
      eval_s = v[2];
      checkpoint_s = v[3];
    }
    const double sps = window.samples / std::max(secs, 1e-9);
    const double steps = std::max<int64_t>(window.steps, 1);
    last_train = {
        {"step", double(ts.step)},
        {"epoch", double(ts.epoch)},
        {"samples", double(ts.samples)},
        {"tokens", double(ts.tokens)},
        {"loss", window.loss / steps},
        {"loss_last", ts.loss},
        {"lr", ts.lr},
        {"samples_per_s", sps},
        {"tokens_per_s", window.tokens / std::max(secs, 1e-9)},
        {"step_time_ms", 1e3 * secs / steps},
        {"data_time_ms", 1e3 * data_s / steps},
    };
    if (test_data) last_train.push_back({"eval_time_s", eval_s});
    if (store) last_train.push_back({"checkpoint_time_s", checkpoint_s});
    if (clipper) {
      last_train.push_back({"grad_norm", window.norms ? window.grad_norm / window.norms : NAN});
      last_train.push_back({"grad_norm_last", ts.grad_norm});
    }
    if (cfg.nonfinite == NonFinite::kSkip || use_scaler)
      last_train.push_back({"skipped_steps", double(ts.skipped_steps)});
    if (use_scaler) last_train.push_back({"loss_scale", scaler.scale()});
    if (mfu) {
      // Per device: the samples of all ranks over the devices of all ranks.
      const double v = mfu.get("compute", mfu->compute, flops_per_sample, sps / world);
      if (!std::isfinite(v) || v < 0)
        throw mfu.error("compute returned " + num(v) +
                        "; an mfu must be a finite value >= 0 (a fraction of the peak)");
      last_train.push_back({"mfu", v});
      if (mfu_peak > 0) last_train.push_back({"mfu_peak_tflops", mfu_peak / 1e12});
    }
    ts.train_metrics = last_train.data();
    ts.train_metric_count = last_train.size();
    emit(KEEL_EVENT_METRICS, "train", &last_train);
    last_record_step = ts.step;
    // The window restarts at log_every boundaries only. A record between them is the last one
    // of a run that ends (a stop, a stop target, the final epoch): its sums stay, so that a
    // run resumed from the checkpoint saved after it reports the same window at the boundary
    // as a run that never stopped.
    if (ts.step % cfg.log_every == 0) window = Window();
  }

  void evaluate(RunSummary& summary) {
    if (!test_data || last_eval_step == ts.step) return;
    const AddElapsed timed(window.eval_s);
    last_eval_step = ts.step;
    emit(KEEL_EVENT_EVAL_START, "test");
    begin("eval");
    at::NoGradGuard no_grad;
    model.get("set_training", model->set_training, 0);
    test_data.call("start_epoch", test_data->start_epoch, int64_t{0});
    double loss_sum = 0;
    int64_t items = 0, correct = 0, rows = 0, samples = 0, batches = 0;
    bool classification = true;
    // Next-token prediction: [batch, time, vocab] outputs for [batch, time] integer targets.
    bool sequence = true;
    while (cfg.eval_max_batches == 0 || batches < cfg.eval_max_batches) {
      keel_batch b{};
      int has = 0;
      test_data.call("next", test_data->next, &b, &has);
      if (!has) break;
      const MicroBatch mb = on_device(checked_batch(test_data, b));
      const at::Tensor &x = mb.inputs, &y = mb.targets;
      at::Tensor out;
      int64_t count = 0;
      double batch_loss = 0;
      {
        Autocast autocast(cfg.precision, device);
        out = forward(x);
        batch_loss = compute_loss(out, y, &count, false).item<double>();
      }
      loss_sum += batch_loss * static_cast<double>(count);
      items += count;
      samples += mb.samples;
      if (classification && out.dim() == 2 && y.dim() == 1 && !y.is_floating_point() &&
          out.size(0) == y.size(0)) {
        correct += out.argmax(1).eq(y).sum().item<int64_t>();
        rows += y.size(0);
      } else {
        classification = false;
      }
      sequence = sequence && out.dim() == 3 && y.dim() == 2 && !y.is_floating_point() &&
                 out.size(0) == y.size(0) && out.size(1) == y.size(1);
      ++batches;
    }
    model.get("set_training", model->set_training, 1);
    if (dist) {
      // Exact over the ranks' shards: sums of losses, items and correct predictions.
      const std::vector<double> v = dist->sum(
          {loss_sum, double(items), double(correct), double(rows), double(samples),
           classification ? 0.0 : 1.0, sequence ? 0.0 : 1.0},
          "reducing the evaluation at step " + std::to_string(ts.step));
      loss_sum = v[0];
      items = static_cast<int64_t>(v[1]);
      correct = static_cast<int64_t>(v[2]);
      rows = static_cast<int64_t>(v[3]);
      samples = static_cast<int64_t>(v[4]);
      classification = v[5] == 0;
      sequence = v[6] == 0;
    }
    end("eval");
    last_eval = {{"step", double(ts.step)},
                 {"epoch", double(ts.epoch)},
                 {"loss", items ? loss_sum / items : NAN}};
    summary.eval_loss = last_eval[2].value;
    if (classification && rows > 0) {
      last_eval.push_back({"accuracy", static_cast<double>(correct) / rows});
      summary.eval_accuracy = last_eval.back().value;
    }
    // The mean loss in bits: bits per character for a character-level language model (for
    // a cross-entropy loss in nats, as every first-party loss computes it).
    if (sequence && batches > 0 && items > 0)
      last_eval.push_back({"bits_per_token", loss_sum / items / std::log(2.0)});
    last_eval.push_back({"samples", static_cast<double>(samples)});
    ts.eval_metrics = last_eval.data();
    ts.eval_metric_count = last_eval.size();
    emit(KEEL_EVENT_EVAL_END, "test");
    emit(KEEL_EVENT_METRICS, "test", &last_eval);
  }

  bool stop_target_reached() const {
    return (cfg.max_steps > 0 && ts.step >= cfg.max_steps) ||
           (cfg.max_samples > 0 && ts.samples >= cfg.max_samples) ||
           (cfg.max_tokens > 0 && ts.tokens >= cfg.max_tokens);
  }

  bool evaluating() const { return cfg.mode != RunMode::kTrain; }

  // Parameter groups from [[optimizer.groups]]: each parameter joins the first group whose
  // regex matches its whole name, else group 0 (the optimizer's own settings).
  void assign_param_groups(std::vector<int32_t>& group, std::vector<double>& lr,
                           std::vector<double>& wd) const {
    group.assign(param_names.size(), 0);
    lr.assign(1, NAN);
    wd.assign(1, NAN);
    for (size_t g = 0; g < cfg.param_groups.size(); ++g) {
      const ParamGroupSpec& spec = cfg.param_groups[g];
      const std::regex re(spec.params);
      size_t matched = 0;
      for (size_t i = 0; i < param_names.size(); ++i)
        if (group[i] == 0 && std::regex_match(param_names[i], re)) {
          group[i] = static_cast<int32_t>(g + 1);
          ++matched;
        }
      if (matched == 0) {
        std::string names;
        for (const char* n : param_names) names += std::string(names.empty() ? "" : ", ") + n;
        throw Error(spec.where + ": optimizer.groups[" + std::to_string(g) + "].params = \"" +
                    spec.params + "\" matches no parameter not already in an earlier group "
                    "(parameters: " + names + "); hint: the regex must match whole names");
      }
      lr.push_back(spec.lr);
      wd.push_back(spec.weight_decay);
    }
  }
};

// Assembles the run: every component created and checked, in dependency order.
void Trainer::State::setup(const RunConfig& config, bool validate_only,
                           const std::optional<Launch>& launch) {
  State& s = *this;
  s.cfg = config;
  s.device = resolve_device(config.device, launch ? launch->local_rank : 0);
  if (launch && launch->world_size > 1) {
    if (config.checkpoint && config.checkpoint_async)
      throw Error("checkpoint.async = true is not supported with several processes yet (" +
                  std::to_string(launch->world_size) + " ranks); hint: set [checkpoint] "
                  "async = false");
    DistributedOptions o;
    o.timeout = std::chrono::seconds(config.dist_timeout_s);
    o.backend = config.dist_backend;
    o.bucket_bytes = config.dist_bucket_cap_mb << 20;
    s.dist = std::make_unique<ProcessGroup>(*launch, o, s.device);
    s.rank = launch->rank;
    s.world = launch->world_size;
    spdlog::info("rank {} of {} ({}, local rank {} of {}), {} backend, device {}", s.rank,
                 s.world, launch->launcher, launch->local_rank, launch->local_world_size,
                 s.dist->backend_name(), s.device.str());
  }
  {
    std::ostringstream text;
    text << "# Resolved from " << config.manifest_path
         << " (extends, --set and defaults applied)\n"
         << config.resolved << "\n";
    s.resolved_text = text.str();
  }
  const fs::path out = config.output_dir;
  const bool evaluate = config.mode == RunMode::kEvaluate;
  const std::string dir = s.on_rank0("prepare the run directory " + out.string(), [&] {
    CreatedEntries& created = *s.created;
    RunDir run = RunDir::open(out.string(), created);
    run.probe_writable(created);
    if (validate_only) return out.string();
    if (evaluate) {
      // A place of its own: the training run's files stay as they are.
      s.dir = run.new_subdir("eval-" + utc_stamp(/*compact=*/true), created);
    } else {
      if (config.resume == RunConfig::Resume::kNo && !config.overwrite) {
        const std::string records = earlier_records(run);
        if (!records.empty()) refuse_earlier_records(out.string(), records);
        // Claimed now: a second fresh run starting into this directory meanwhile is refused.
        const int fd = run.open_file("manifest.resolved.toml", O_EXCL, created);
        if (fd < 0) refuse_earlier_records(out.string(), "manifest.resolved.toml");
        const bool ok = write_all(fd, s.resolved_text);
        if (::close(fd) != 0 || !ok)
          throw Error("cannot write " + run.path_of("manifest.resolved.toml") + ": " +
                      std::strerror(errno) + "; hint: set [run] output_dir to a writable "
                      "directory");
        s.claimed = true;
      }
      run.subdir("checkpoints", created);
      s.dir = std::move(run);
    }
    s.dir_before = s.dir->identities();
    return s.dir->path();
  });
  if (validate_only) {
    // Components create their files (metrics.jsonl, ...) in a scratch directory, so that
    // validating never touches a run directory's files.
    std::string tmpl = (fs::temp_directory_path() / "keel-validate-XXXXXX").string();
    if (!mkdtemp(tmpl.data()))
      throw Error("cannot create a scratch directory in " + fs::temp_directory_path().string() +
                  ": " + std::strerror(errno) + "; hint: set TMPDIR to a writable directory");
    s.scratch_dir = tmpl;
    s.run_dir = tmpl;
  } else {
    s.run_dir = dir;
  }
  s.run_id = s.on_rank0("choose the run id", [] { return random_token(); });
  if (!validate_only && config.resume != RunConfig::Resume::kNo) {
    const std::string dir = s.on_rank0("choose the checkpoint to resume from", [&] {
      s.pick_resume_checkpoint();
      return s.resume_dir;
    });
    if (s.rank != 0) s.follow_resume_checkpoint(dir);
  }

  // Model: parameters (for the optimizer and clipper) and state (for checkpoints).
  s.model = s.make<keel_model>(config.model);
  const size_t np = s.model.get("param_count", s.model->param_count);
  if (np == 0)
    throw s.model.error("param_count returned 0: the model has no trainable parameters");
  std::set<std::string> seen;
  for (size_t i = 0; i < np; ++i) {
    const auto [name, t] = named_entry(s.model, "param", s.model->param, i);
    const std::string what = "param(" + std::to_string(i) + ")";
    const std::string n(name);  // terminated within KEEL_NAME_CAPACITY (named_entry)
    if (!seen.insert(n).second)
      throw s.model.error("duplicate parameter name '" + n + "' (param " + std::to_string(i) +
                          "); every parameter needs its own name");
    const at::Tensor p = borrow(t);
    if (!p.is_floating_point() || !p.requires_grad())
      throw s.model.error(what + " '" + n + "' is not a floating-point tensor that requires "
                          "grad; parameters are the tensors the optimizer trains");
    // A parameter shared between modules (weight tying: lm_head.weight is wte.weight) is
    // trained, counted and saved once, under its first name.
    if (const int64_t first = same_tensor_as(s.params, p); first >= 0) {
      spdlog::info("{}: parameter '{}' is '{}' (shared): trained and saved once, as '{}'",
                   s.model.label(), n, s.param_names[first], s.param_names[first]);
      continue;
    }
    s.param_names.push_back(name);
    s.param_handles.push_back(t);
    s.params.push_back(p);
  }
  const size_t ns = s.model.get("state_count", s.model->state_count);
  seen.clear();
  std::vector<at::Tensor> state_tensors;
  for (size_t i = 0; i < ns; ++i) {
    const keel_named_tensor nt = named_entry(s.model, "state", s.model->state, i);
    if (!seen.insert(nt.name).second)
      throw s.model.error("duplicate state name '" + std::string(nt.name) + "'");
    if (same_tensor_as(state_tensors, borrow(nt.tensor)) >= 0) continue;  // shared: saved once
    state_tensors.push_back(borrow(nt.tensor));
    s.model_state.push_back(nt);
  }
  if (!s.device.is_cpu()) {
    // Parameters and buffers move in place (same tensors, new storage), like Module::to.
    at::NoGradGuard no_grad;
    for (const auto& nt : s.model_state) borrow(nt.tensor).set_data(borrow(nt.tensor).to(s.device));
    for (at::Tensor& p : s.params)
      if (p.device() != s.device) p.set_data(p.to(s.device));
  }
  s.flops_per_sample = s.model.get("flops_per_sample", s.model->flops_per_sample);
  if (!std::isfinite(s.flops_per_sample) || s.flops_per_sample < 0)
    throw s.model.error("flops_per_sample returned " + num(s.flops_per_sample) +
                        "; it must be >= 0 (0: unknown)");

  // Data, and the run's planned length (for schedules and progress).
  s.train_data = s.make<keel_dataset>(config.train_data);
  if (config.test_data && s.evaluating()) s.test_data = s.make<keel_dataset>(*config.test_data);
  const int64_t batches = s.train_data.get("batches_per_epoch", s.train_data->batches_per_epoch);
  if (batches <= 0)
    throw s.train_data.error("batches_per_epoch returned " + std::to_string(batches) +
                             ": the training split yields no batches; hint: check its path, "
                             "limit and batch_size");
  const int64_t steps_per_epoch = (batches + config.grad_accum - 1) / config.grad_accum;
  std::vector<int64_t> plans;
  if (config.epochs > 0) plans.push_back(config.epochs * steps_per_epoch);
  if (config.max_steps > 0) plans.push_back(config.max_steps);
  if (config.max_samples > 0) {
    const int64_t size = s.train_data.get("size", s.train_data->size);
    if (size <= 0)
      throw s.train_data.error("size returned " + std::to_string(size) +
                               "; train.max_samples needs the samples per epoch");
    // Samples of all ranks per optimizer step (size and batches are this rank's shard's).
    const double per_step = static_cast<double>(size) / batches * config.grad_accum * s.world;
    plans.push_back(static_cast<int64_t>(std::ceil(config.max_samples / per_step)));
  }
  if (config.max_tokens > 0) {
    // Tokens of all ranks per optimizer step, from the dataset's tokens per sample (ABI 1.4).
    const int64_t tps = KEEL_HAS_SLOT(s.train_data, keel_dataset, tokens_per_sample)
                            ? s.train_data.get("tokens_per_sample", s.train_data->tokens_per_sample)
                            : 0;
    const int64_t size = s.train_data.get("size", s.train_data->size);
    if (tps > 0 && size > 0) {
      const double per_step =
          static_cast<double>(size) / batches * config.grad_accum * s.world * static_cast<double>(tps);
      plans.push_back(static_cast<int64_t>(std::ceil(config.max_tokens / per_step)));
    } else {
      spdlog::warn("{}: does not report a fixed number of tokens per sample, so train.max_tokens "
                   "stops the run but does not plan its length (schedules and progress use the "
                   "other targets{})",
                   s.train_data.label(), plans.empty() ? "; there are none: the length is unknown" : "");
    }
  }
  s.total_steps = plans.empty() ? 0 : *std::min_element(plans.begin(), plans.end());

  // Optimizer over the parameter groups.
  std::vector<int32_t> group;
  std::vector<double> group_lr, group_wd;
  s.assign_param_groups(group, group_lr, group_wd);
  keel_create_context octx = s.param_context(config.optimizer);
  octx.param_group = group.data();
  octx.group_count = group_lr.size();
  octx.group_lr = group_lr.data();
  octx.group_weight_decay = group_wd.data();
  s.optimizer = create_instance<keel_optimizer>(*config.optimizer.component, octx);
  const size_t groups = s.optimizer.get("group_count", s.optimizer->group_count);
  if (groups == 0 || groups > s.params.size())
    throw s.optimizer.error("group_count returned " + std::to_string(groups) + " for " +
                            std::to_string(s.params.size()) +
                            " parameters; an optimizer has between 1 and one group per parameter");
  for (size_t g = 0; g < groups; ++g) {
    const double lr = s.optimizer.get("get_lr", s.optimizer->get_lr, g);
    if (!std::isfinite(lr) || lr < 0)
      throw s.optimizer.error("get_lr(" + std::to_string(g) + ") returned " + num(lr) +
                              "; a learning rate is finite and >= 0");
    s.base_lrs.push_back(lr);
  }

  if (config.lr_scheduler) {
    keel_create_context sctx = s.context(*config.lr_scheduler);
    sctx.total_steps = s.total_steps;
    s.scheduler = create_instance<keel_lr_scheduler>(*config.lr_scheduler->component, sctx);
  }
  s.loss = s.make<keel_loss>(config.loss);
  const bool counts = KEEL_HAS_SLOT(s.loss, keel_loss, count_items);
  if (config.accum_normalization == AccumNorm::kItems && !counts)
    throw s.loss.error("does not report item counts (no count_items), which "
                       "train.accum_normalization = \"items\" needs; hint: use \"mean\" or \"auto\"");
  s.items_normalization = counts && config.accum_normalization != AccumNorm::kMean;
  s.linear_loss = KEEL_HAS_SLOT(s.model, keel_model, forward_features) &&
                  KEEL_HAS_SLOT(s.loss, keel_loss, compute_linear);
  if (s.linear_loss)
    spdlog::info("{} applies the output layer of {} itself in training steps "
                 "(forward_features, compute_linear): the model's whole output is not built "
                 "there; evaluation calls forward and compute",
                 s.loss.label(), s.model.label());
  s.use_scaler = config.precision == Precision::kFp16;

  if (config.grad_clipper) {
    s.clipper = create_instance<keel_grad_clipper>(*config.grad_clipper->component,
                                                   s.param_context(*config.grad_clipper));
  }
  if (config.mfu) {
    // The parameters too (deduplicated): a calculator may derive FLOPs from their count.
    s.mfu = create_instance<keel_mfu>(*config.mfu->component, s.param_context(*config.mfu));
    if (KEEL_HAS_SLOT(s.mfu, keel_mfu, peak_flops)) {
      s.mfu_peak = s.mfu.get("peak_flops", s.mfu->peak_flops);
      if (!std::isfinite(s.mfu_peak) || s.mfu_peak <= 0)
        throw s.mfu.error("peak_flops returned " + num(s.mfu_peak) +
                          "; a peak is a finite FLOP/s value > 0");
    }
  }
  if (config.profiler) s.profiler = s.make<keel_profiler>(*config.profiler);

  // Hooks in call order: ascending priority, ties in manifest order.
  std::vector<const ComponentSpec*> order;
  for (const auto& h : config.hooks) order.push_back(&h);
  std::stable_sort(order.begin(), order.end(),
                   [](const ComponentSpec* a, const ComponentSpec* b) { return a->priority < b->priority; });
  std::map<std::string, std::string> stateful_labels;  // label -> section
  for (const ComponentSpec* h : order) {
    s.hooks.push_back(s.make<keel_hook>(*h));
    const auto& hook = s.hooks.back();
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
      s.hook_state_names.push_back(h->label + "." + nt.name);
      s.hook_state.push_back(nt);
    }
  }
  for (size_t i = 0; i < s.hook_state.size(); ++i)
    s.hook_state[i].name = s.hook_state_names[i].c_str();

  s.ts.struct_size = sizeof(s.ts);
  s.ts.max_steps = s.total_steps;
  s.ts.epochs = config.epochs;
  s.ts.grad_norm = NAN;

  if (config.checkpoint) {
    s.checkpoint = s.make<keel_checkpoint>(*config.checkpoint);
    Retention keep{config.checkpoint_keep_last, config.checkpoint_keep_best,
                   config.checkpoint_best_metric, config.checkpoint_best_max};
    s.store = std::make_unique<CheckpointStore>((s.run_dir / "checkpoints").string(),
                                                &s.checkpoint, keep, s.run_id);
    if (!validate_only && s.rank == 0 && s.store->remove_stale() > 0)
      spdlog::info("removed what interrupted checkpoint saves left in {}",
                   (s.run_dir / "checkpoints").string());
    if (!s.resume_dir.empty()) {
      s.load_resume_checkpoint();
      spdlog::info("resuming from {} (step {}, epoch {}, batch {} of that epoch)", s.resume_dir,
                   s.resumed.step, s.resumed.epoch, s.resumed.epoch_batches);
      s.emit(KEEL_EVENT_CHECKPOINT_LOADED, nullptr, nullptr, s.resume_dir.c_str());
    } else if (!config.init_from.empty()) {
      s.warm_start();
      if (!validate_only)
        s.emit(KEEL_EVENT_CHECKPOINT_LOADED, nullptr, nullptr, config.init_from.c_str());
    }
  }
  if (validate_only) return;

  if (s.dist) {
    // Every rank starts from rank 0's parameters and buffers (DDP's broadcast at start).
    std::vector<at::Tensor> state;
    for (const auto& nt : s.model_state) state.push_back(borrow(nt.tensor));
    s.dist->verify_same(state, "the model's parameters and buffers");
    s.dist->broadcast(state, "broadcasting the model from rank 0");
    std::vector<std::string> names(s.param_names.begin(), s.param_names.end());
    s.grad_sync = std::make_unique<GradSync>(*s.dist, s.params, names);
    spdlog::info("gradients all-reduced in {}", s.grad_sync->describe());
    // Ranks other than 0 draw their own random numbers from here on (dropout, ...).
    if (s.rank > 0 && s.resume_dir.empty())
      at::manual_seed(config.seed + 1000003ull * static_cast<uint64_t>(s.rank));
  }
  if (s.rank != 0) return;  // rank 0 writes the run directory's files

  // Written last (a fresh run's manifest.resolved.toml excepted: it claimed the directory), so
  // that a resumed or --overwrite run failing before step 1 leaves the earlier ones untouched.
  // run.log is opened first: a run.log keel refuses to write leaves the earlier files as they
  // were. It is appended to, each run's part starting with a line naming it.
  CreatedEntries& created = *s.created;
  bool had_log = false;
  const int log_fd = s.dir->open_file("run.log", O_APPEND, created, &had_log);
  try {
    if (!s.claimed) s.dir->write_file("manifest.resolved.toml", s.resolved_text, created);
    s.dir->write_file("plugins.json", used_plugins_json(config), created);
  } catch (...) {
    ::close(log_fd);
    throw;
  }
  const std::string header = std::string(had_log ? "\n" : "") + "===== keel " +
                             (evaluate ? "evaluate" : "train") + ", run " + s.run_id + ", " +
                             utc_stamp(/*compact=*/false) + ", pid " +
                             std::to_string(::getpid()) + " =====\n";
  if (!write_all(log_fd, header)) {
    ::close(log_fd);
    throw Error("cannot write " + s.dir->path_of("run.log") + ": " + std::strerror(errno) +
                "; hint: set [run] output_dir to a writable directory");
  }
  attach_run_log(log_fd, s.dir->path_of("run.log"));  // with what was logged until now
  s.run_log_attached = true;
}

Trainer::State::~State() {
  grad_sync.reset();  // its autograd hooks hold the parameters
  // Instances go first (in reverse order of creation), so that files they hold are closed.
  hooks.clear();
  store.reset();
  checkpoint.reset();
  profiler.reset();
  mfu.reset();
  clipper.reset();
  loss.reset();
  scheduler.reset();
  optimizer.reset();
  test_data.reset();
  train_data.reset();
  model.reset();
  if (run_log_attached) detach_run_log();
  std::error_code ec;
  if (!scratch_dir.empty()) fs::remove_all(scratch_dir, ec);
}

Trainer::Trainer(const RunConfig& config, bool validate_only) : s_(std::make_unique<State>()) {
  // `keel validate` checks one process's view, alone.
  const std::optional<Launch> launch = validate_only ? std::nullopt : detect_launch();
  // What this start creates (rank 0 alone prepares the run directory): removed again when it
  // fails, and after `keel validate`.
  CreatedEntries created;
  s_->created = &created;
  // Files the components created and hold open join the list before they are closed.
  const auto undo = [&] {
    if (s_->dir) created.add_open_files(*s_->dir, s_->dir_before);
    s_.reset();  // closes every file the components opened
    return created.remove_all();
  };
  try {
    s_->setup(config, validate_only, launch);
  } catch (const Error& e) {
    const std::string left = undo();
    if (left.empty()) throw;
    throw Error(std::string(e.what()) + " (left behind: " + left + ")");
  } catch (...) {
    undo();
    throw;
  }
  s_->created = nullptr;
  if (validate_only) {
    const std::string left = created.remove_all();
    if (!left.empty())
      throw Error("validation left files behind in the run directory: " + left);
  }
}

void check_run(const RunConfig& config) { Trainer trainer(config, /*validate_only=*/true); }

Trainer::~Trainer() = default;

RunSummary Trainer::train() {
  State& s = *s_;
  RunSummary summary;
  summary.run_dir = s.run_dir.string();
  try {
    if (s.cfg.mode == RunMode::kEvaluate) {
      if (s.cfg.init_from.empty())
        spdlog::warn("evaluating freshly initialised weights: set [checkpoint] init_from to a "
                     "checkpoint directory to evaluate trained ones");
      s.emit(KEEL_EVENT_TRAIN_START);
      s.evaluate(summary);
      s.emit(KEEL_EVENT_TRAIN_END);
      return summary;
    }
    const StopSignals signals;
    const bool resumed = !s.resume_dir.empty();
    s.model.get("set_training", s.model->set_training, 1);
    s.set_lr_for(s.ts.step);
    s.emit(KEEL_EVENT_TRAIN_START);
    if (s.store && s.cfg.checkpoint_initial && !resumed) s.save_checkpoint();
    if (!resumed) s.window = Window();
    s.window.start = Clock::now();

    // A resumed run that already reached its end (a changed max_steps, or the at_end
    // checkpoint of a finished run) trains no further.
    bool done = s.stop_target_reached() || (s.cfg.epochs > 0 && s.ts.epoch >= s.cfg.epochs);
    if (done) spdlog::info("--resume: the run had already reached its end at step {}", s.ts.step);
    for (int64_t epoch = s.ts.epoch; !done; ++epoch) {
      s.ts.epoch = epoch;
      s.epoch_finished = false;
      s.epoch_batches = 0;
      s.emit(KEEL_EVENT_EPOCH_START);
      if (resumed && epoch == s.resumed.epoch && s.resumed.epoch_batches > 0) {
        s.seek_train_data(epoch, s.resumed.epoch_batches);
        s.epoch_batches = s.resumed.epoch_batches;  // counted from the start of the epoch
      } else {
        s.train_data.call("start_epoch", s.train_data->start_epoch, epoch);
      }
      bool epoch_complete = false;
      const bool final_epoch = s.cfg.epochs > 0 && epoch + 1 >= s.cfg.epochs;
      while (!done) {
        const std::vector<MicroBatch> mbs = s.fetch_micro_batches();
        if (mbs.empty()) {
          epoch_complete = true;
          break;
        }
        s.epoch_batches += static_cast<int64_t>(mbs.size());
        summary.last_loss = s.train_step(mbs);
        s.finish_async_save(/*block=*/false);
        // Several ranks: one agreement on every rank's requests and signals (below, again
        // after events that may have set requests).
        if (const int sig = s.agree_requests(g_stop_signal.load(), /*always=*/true))
          s.stop_for_signal(sig);
        const bool last = s.stop_target_reached() || (s.requests & KEEL_REQUEST_STOP);
        if (s.ts.step % s.cfg.log_every == 0 || last) s.log_train_metrics();
        s.agree_requests(0, false);
        if ((s.cfg.eval_every_steps > 0 && s.ts.step % s.cfg.eval_every_steps == 0) ||
            (s.requests & KEEL_REQUEST_EVAL))
          s.evaluate(summary);
        s.agree_requests(0, false);
        if (s.store && ((s.cfg.checkpoint_every_steps > 0 &&
                         s.ts.step % s.cfg.checkpoint_every_steps == 0) ||
                        (s.requests & KEEL_REQUEST_CHECKPOINT)))
          s.save_checkpoint();
        s.agree_requests(0, false);
        done = last || (s.requests & KEEL_REQUEST_STOP);
        // A stop requested by the evaluation or the checkpoint: record the steps since the
        // last record (a stop requested by then was recorded above).
        if (done && s.unrecorded_steps()) s.log_train_metrics();
        s.requests = 0;
        if (!done) s.set_lr_for(s.ts.step);
      }
      if (final_epoch && s.unrecorded_steps()) s.log_train_metrics();  // the last, partial window
      if (epoch_complete) {
        s.emit(KEEL_EVENT_EPOCH_END);
        s.epoch_finished = true;  // a checkpoint from here on starts the next epoch
      }
      if (final_epoch) done = true;
      s.agree_requests(0, false);
      // What the epoch-end events request: a stop ends the run (after its evaluation, with a
      // record of the steps since the last one), a checkpoint is saved.
      const auto stop_if_requested = [&] {
        s.agree_requests(0, false);
        if (s.requests & KEEL_REQUEST_STOP) done = true;
        if (done && s.unrecorded_steps()) s.log_train_metrics();
      };
      // After each epoch, when the run ends, and on request.
      if ((s.cfg.eval_each_epoch && epoch_complete) || done ||
          (s.requests & (KEEL_REQUEST_EVAL | KEEL_REQUEST_STOP)))
        s.evaluate(summary);
      stop_if_requested();  // e.g. early stopping on that evaluation
      if (s.store && (s.requests & KEEL_REQUEST_CHECKPOINT) && s.last_saved_step != s.ts.step) {
        s.save_checkpoint();
        stop_if_requested();  // a stop requested by that CHECKPOINT_SAVED
      }
      s.requests = 0;
    }

    if (s.store && s.cfg.checkpoint_at_end && s.last_saved_step != s.ts.step) s.save_checkpoint();
    s.finish_async_save(/*block=*/true);
    s.emit(KEEL_EVENT_TRAIN_END);
    if (s.profiler) s.profiler.call("flush", s.profiler->flush);
    // No rank leaves (taking the store it may serve with it) while another still needs it.
    if (s.dist) s.dist->any(false, "finishing the run");
  } catch (const std::exception& e) {
    // Tell the hooks why the run ends (their own failures here cannot be reported any better).
    const std::string message =
        dynamic_cast<const c10::Error*>(&e) ? static_cast<const c10::Error&>(e).what_without_backtrace()
                                            : e.what();
    // A save in flight is finished first: its checkpoint may be what a resume needs.
    if (s.store && s.store->in_flight()) {
      try {
        spdlog::info("checkpoint committed: {}", s.store->wait());
      } catch (const std::exception& save_error) {
        spdlog::error("asynchronous checkpoint save failed: {}", save_error.what());
      }
    }
    try {
      s.emit(KEEL_EVENT_EXCEPTION, nullptr, nullptr, nullptr, 0, message.c_str());
    } catch (...) {
    }
    throw;
  }
  summary.steps = s.ts.step;
  summary.samples = s.ts.samples;
  summary.skipped_steps = s.ts.skipped_steps;
  // A signal that arrived after the last step (during the final evaluation or save) did not
  // change the run, which ended anyway; the exit status still reports it.
  summary.stop_signal = s.stop_signal ? s.stop_signal : g_stop_signal.load();
  return summary;
}

}  // namespace keel
