#include "trainer.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "checkpoint_store.hpp"
#include "components.hpp"
#include "error.hpp"
#include "host.hpp"
#include "keel/tensor.hpp"

namespace fs = std::filesystem;

namespace keel {

using Clock = std::chrono::steady_clock;

void configure_threads(int64_t threads) {
  const int64_t n = threads > 0 ? threads
                                : std::max<int64_t>(1, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(n));
  // One pool: OpenBLAS threads would spin against LibTorch's (measured 4x slower on 2 cores).
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    f(1);
}

struct Trainer::State {
  RunConfig cfg;
  fs::path run_dir;

  Instance<keel_model> model;
  Instance<keel_dataset> train_data, test_data;
  Instance<keel_optimizer> optimizer;
  Instance<keel_lr_scheduler> scheduler;
  Instance<keel_loss> loss;
  Instance<keel_grad_clipper> clipper;
  Instance<keel_mfu> mfu;
  Instance<keel_profiler> profiler;
  Instance<keel_checkpoint> checkpoint;
  std::vector<Instance<keel_hook>> hooks;
  std::unique_ptr<CheckpointStore> store;

  std::vector<keel_tensor*> param_handles;
  std::vector<const char*> param_names;
  std::vector<keel_named_tensor> model_state;
  std::vector<double> base_lrs;
  double flops_per_sample = 0;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;

  keel_trainer_state ts{};
  bool stop_requested = false;

  keel_create_context context(const ComponentSpec& spec) const {
    keel_create_context c{};
    c.struct_size = sizeof(c);
    c.host = host();
    c.options = &spec.options;
    c.section = spec.section.c_str();
    c.seed = cfg.seed;
    c.rank = 0;
    c.world_size = 1;
    c.run_dir = run_dir.c_str();
    return c;
  }

  template <class Abi>
  Instance<Abi> make(const ComponentSpec& spec) const {
    return create_instance<Abi>(*spec.component, context(spec));
  }

  // --- profiler marks (no-ops without a profiler) ---
  void begin(const char* phase) const {
    if (profiler) profiler->begin(profiler.self(), phase, ts.step);
  }
  void end(const char* phase) const {
    if (profiler) profiler->end(profiler.self(), phase, ts.step);
  }

  void emit(keel_event_kind kind, const char* split = nullptr,
            const std::vector<keel_metric>* metrics = nullptr, const char* path = nullptr) {
    if (hooks.empty()) return;
    begin("hooks");
    for (const auto& h : hooks) {
      keel_event ev{};
      ev.struct_size = sizeof(ev);
      ev.kind = kind;
      ev.state = &ts;
      ev.split = split;
      ev.metrics = metrics ? metrics->data() : nullptr;
      ev.metric_count = metrics ? metrics->size() : 0;
      ev.path = path;
      h.call("on_event", h->on_event, &ev);
      if (ev.requests & KEEL_REQUEST_STOP) stop_requested = true;
    }
    end("hooks");
  }

  void set_lr_for(int64_t step) {
    const double f = scheduler ? scheduler->factor(scheduler.self(), step) : 1.0;
    if (!std::isfinite(f) || f < 0)
      throw Error(scheduler.label() + ": factor(" + std::to_string(step) + ") returned " +
                  std::to_string(f) + "; a schedule must return a finite value >= 0");
    for (size_t g = 0; g < base_lrs.size(); ++g)
      optimizer->set_lr(optimizer.self(), g, base_lrs[g] * f);
    ts.lr = base_lrs.empty() ? 0 : base_lrs[0] * f;
  }

  CheckpointMeta meta() const { return {ts.step, ts.epoch, ts.samples, ts.tokens}; }

  std::string save_checkpoint() {
    begin("checkpoint");
    const std::string dir = store->save(model_state, meta());
    end("checkpoint");
    spdlog::info("checkpoint committed: {}", dir);
    emit(KEEL_EVENT_CHECKPOINT_SAVED, nullptr, nullptr, dir.c_str());
    return dir;
  }

  void evaluate(RunSummary& summary) {
    if (!test_data) return;
    emit(KEEL_EVENT_EVAL_START, "test");
    begin("eval");
    at::NoGradGuard no_grad;
    model->set_training(model.self(), 0);
    test_data.call("start_epoch", test_data->start_epoch, int64_t{0});
    double loss_sum = 0;
    int64_t items = 0, correct = 0, rows = 0, batches = 0;
    bool classification = true;
    while (cfg.eval_max_batches == 0 || batches < cfg.eval_max_batches) {
      keel_batch b{};
      int has = 0;
      test_data.call("next", test_data->next, &b, &has);
      if (!has) break;
      const at::Tensor x = adopt(b.inputs), y = adopt(b.targets);
      keel_tensor* out_h = nullptr;
      model.call("forward", model->forward, peek(x), &out_h);
      const at::Tensor out = adopt(out_h);
      keel_tensor* loss_h = nullptr;
      int64_t count = 0;
      loss.call("compute", loss->compute, peek(out), peek(y), &loss_h, &count);
      loss_sum += adopt(loss_h).item<double>() * static_cast<double>(count);
      items += count;
      if (classification && out.dim() == 2 && y.dim() == 1 && !y.is_floating_point()) {
        correct += out.argmax(1).eq(y).sum().item<int64_t>();
        rows += y.size(0);
      } else {
        classification = false;
      }
      ++batches;
    }
    model->set_training(model.self(), 1);
    end("eval");
    std::vector<keel_metric> metrics = {{"step", static_cast<double>(ts.step)},
                                        {"epoch", static_cast<double>(ts.epoch)},
                                        {"loss", items ? loss_sum / items : NAN}};
    summary.eval_loss = metrics[2].value;
    if (classification && rows > 0) {
      metrics.push_back({"accuracy", static_cast<double>(correct) / rows});
      summary.eval_accuracy = metrics.back().value;
    }
    metrics.push_back({"samples", static_cast<double>(rows)});
    emit(KEEL_EVENT_EVAL_END, "test");
    emit(KEEL_EVENT_METRICS, "test", &metrics);
  }
};

Trainer::Trainer(const RunConfig& config) : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.cfg = config;
  s.run_dir = config.output_dir;
  std::error_code ec;
  fs::create_directories(s.run_dir / "checkpoints", ec);
  if (ec)
    throw Error("cannot create run directory " + s.run_dir.string() + ": " + ec.message() +
                "; hint: set [run] output_dir to a writable place");
  {
    std::ofstream resolved(s.run_dir / "manifest.resolved.toml");
    resolved << "# Resolved from " << config.manifest_path
             << " (extends, --set and defaults applied)\n"
             << config.resolved << "\n";
  }
  configure_threads(config.threads);
  at::manual_seed(config.seed);

  s.model = s.make<keel_model>(config.model);
  const size_t np = s.model->param_count(s.model.self());
  for (size_t i = 0; i < np; ++i) {
    const char* name = nullptr;
    keel_tensor* t = nullptr;
    s.model.call("param", s.model->param, i, &name, &t);
    s.param_names.push_back(name);
    s.param_handles.push_back(t);
  }
  const size_t ns = s.model->state_count(s.model.self());
  for (size_t i = 0; i < ns; ++i) {
    keel_named_tensor nt{};
    s.model.call("state", s.model->state, i, &nt.name, &nt.tensor);
    s.model_state.push_back(nt);
  }
  s.flops_per_sample = s.model->flops_per_sample(s.model.self());
  if (!std::isfinite(s.flops_per_sample)) s.flops_per_sample = 0;

  s.train_data = s.make<keel_dataset>(config.train_data);
  if (config.test_data) s.test_data = s.make<keel_dataset>(*config.test_data);
  s.steps_per_epoch = s.train_data->batches_per_epoch(s.train_data.self());
  if (s.steps_per_epoch <= 0)
    throw Error(s.train_data.label() + ": [data.train] yields no batches per epoch; hint: check "
                "its path, limit and batch_size");
  s.total_steps = config.epochs > 0 ? config.epochs * s.steps_per_epoch : config.max_steps;
  if (config.max_steps > 0) s.total_steps = std::min(s.total_steps, config.max_steps);

  keel_create_context octx = s.context(config.optimizer);
  octx.params = s.param_handles.data();
  octx.param_names = s.param_names.data();
  octx.param_count = s.param_handles.size();
  s.optimizer = create_instance<keel_optimizer>(*config.optimizer.component, octx);
  for (size_t g = 0; g < s.optimizer->group_count(s.optimizer.self()); ++g)
    s.base_lrs.push_back(s.optimizer->get_lr(s.optimizer.self(), g));

  if (config.lr_scheduler) {
    keel_create_context sctx = s.context(*config.lr_scheduler);
    sctx.total_steps = s.total_steps;
    s.scheduler = create_instance<keel_lr_scheduler>(*config.lr_scheduler->component, sctx);
  }
  s.loss = s.make<keel_loss>(config.loss);
  if (config.grad_clipper) {
    keel_create_context cctx = s.context(*config.grad_clipper);
    cctx.params = s.param_handles.data();
    cctx.param_names = s.param_names.data();
    cctx.param_count = s.param_handles.size();
    s.clipper = create_instance<keel_grad_clipper>(*config.grad_clipper->component, cctx);
  }
  if (config.mfu) s.mfu = s.make<keel_mfu>(*config.mfu);
  if (config.profiler) s.profiler = s.make<keel_profiler>(*config.profiler);
  if (config.checkpoint) {
    s.checkpoint = s.make<keel_checkpoint>(*config.checkpoint);
    s.store = std::make_unique<CheckpointStore>((s.run_dir / "checkpoints").string(),
                                                &s.checkpoint, config.checkpoint_keep_last);
    if (!config.init_from.empty()) {
      s.store->load(config.init_from, s.model_state);
      spdlog::info("model weights loaded from {}", config.init_from);
    }
  }
  for (const auto& h : config.hooks) s.hooks.push_back(s.make<keel_hook>(h));

  s.ts.struct_size = sizeof(s.ts);
  s.ts.max_steps = s.total_steps;
  s.ts.epochs = config.epochs;
}

Trainer::~Trainer() = default;

RunSummary Trainer::train() {
  State& s = *s_;
  RunSummary summary;
  summary.run_dir = s.run_dir.string();
  s.model->set_training(s.model.self(), 1);
  s.set_lr_for(0);
  s.emit(KEEL_EVENT_TRAIN_START);
  if (s.store && s.cfg.checkpoint_initial) s.save_checkpoint();

  // Window of the current log interval.
  double window_loss = 0, window_norm = 0, window_data_s = 0;
  int64_t window_steps = 0, window_samples = 0, window_tokens = 0;
  auto window_start = Clock::now();
  int64_t last_saved = s.cfg.checkpoint_initial ? 0 : -1;
  bool done = false, epoch_complete = false;

  for (int64_t epoch = 0; !done; ++epoch) {
    s.ts.epoch = epoch;
    s.emit(KEEL_EVENT_EPOCH_START);
    s.train_data.call("start_epoch", s.train_data->start_epoch, epoch);
    epoch_complete = false;
    while (true) {
      // data
      const auto t_data = Clock::now();
      s.begin("data");
      keel_batch b{};
      int has = 0;
      s.train_data.call("next", s.train_data->next, &b, &has);
      s.end("data");
      if (!has) {
        epoch_complete = true;
        break;
      }
      const at::Tensor x = adopt(b.inputs), y = adopt(b.targets);
      window_data_s += std::chrono::duration<double>(Clock::now() - t_data).count();
      s.emit(KEEL_EVENT_STEP_START);

      s.optimizer->zero_grad(s.optimizer.self());
      s.begin("forward");
      keel_tensor* out_h = nullptr;
      s.model.call("forward", s.model->forward, peek(x), &out_h);
      const at::Tensor out = adopt(out_h);
      keel_tensor* loss_h = nullptr;
      int64_t count = 0;
      s.loss.call("compute", s.loss->compute, peek(out), peek(y), &loss_h, &count);
      const at::Tensor loss = adopt(loss_h);
      s.end("forward");
      const double loss_value = loss.item<double>();
      if (!std::isfinite(loss_value))
        throw Error("non-finite loss (" + std::to_string(loss_value) + ") at step " +
                    std::to_string(s.ts.step + 1) + "; hint: lower the learning rate or enable "
                    "gradient clipping");

      s.begin("backward");
      loss.backward();
      s.end("backward");

      double norm = NAN;
      if (s.clipper) {
        s.begin("clip");
        s.clipper.call("clip", s.clipper->clip, &norm);
        s.end("clip");
      }
      s.begin("optimizer");
      s.optimizer.call("step", s.optimizer->step);
      s.end("optimizer");

      s.ts.step += 1;
      s.ts.samples += b.samples;
      s.ts.tokens += b.tokens;
      s.ts.loss = loss_value;
      summary.last_loss = loss_value;
      window_loss += loss_value;
      window_norm += std::isfinite(norm) ? norm : 0;
      window_steps += 1;
      window_samples += b.samples;
      window_tokens += b.tokens;
      s.emit(KEEL_EVENT_STEP_END);

      const bool reached = (s.cfg.max_steps > 0 && s.ts.step >= s.cfg.max_steps) ||
                           s.stop_requested;
      if (s.ts.step % s.cfg.log_every == 0 || reached) {
        const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
        const double sps = window_samples / std::max(secs, 1e-9);
        std::vector<keel_metric> m = {
            {"step", double(s.ts.step)},
            {"epoch", double(s.ts.epoch)},
            {"samples", double(s.ts.samples)},
            {"tokens", double(s.ts.tokens)},
            {"loss", window_loss / window_steps},
            {"loss_last", loss_value},
            {"lr", s.ts.lr},
            {"samples_per_s", sps},
            {"tokens_per_s", window_tokens / std::max(secs, 1e-9)},
            {"step_time_ms", 1e3 * secs / window_steps},
            {"data_time_ms", 1e3 * window_data_s / window_steps},
        };
        if (s.clipper) m.push_back({"grad_norm", window_norm / window_steps});
        if (s.mfu) m.push_back({"mfu", s.mfu->compute(s.mfu.self(), s.flops_per_sample, sps)});
        s.emit(KEEL_EVENT_METRICS, "train", &m);
        window_loss = window_norm = window_data_s = 0;
        window_steps = window_samples = window_tokens = 0;
        window_start = Clock::now();
      }
      if (s.store && s.cfg.checkpoint_every_steps > 0 &&
          s.ts.step % s.cfg.checkpoint_every_steps == 0) {
        s.save_checkpoint();
        last_saved = s.ts.step;
      }
      if (reached || s.stop_requested) {
        done = true;
        break;
      }
      s.set_lr_for(s.ts.step);
    }
    if (epoch_complete) s.emit(KEEL_EVENT_EPOCH_END);
    if (s.cfg.epochs > 0 && epoch + 1 >= s.cfg.epochs) done = true;
    // Evaluate after every epoch, and once more when a step target ends the run mid-epoch.
    if (s.cfg.eval_each_epoch && (epoch_complete || done)) s.evaluate(summary);
  }

  if (s.store && s.cfg.checkpoint_at_end && last_saved != s.ts.step) s.save_checkpoint();
  s.emit(KEEL_EVENT_TRAIN_END);
  if (s.profiler) s.profiler.call("flush", s.profiler->flush);
  summary.steps = s.ts.step;
  summary.samples = s.ts.samples;
  return summary;
}

}  // namespace keel
