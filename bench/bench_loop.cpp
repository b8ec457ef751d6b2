// bench_loop: the per-step cost of the quickstart run trained THROUGH keel (manifest, plugins,
// C ABI, keel::Trainer) against the same training written by hand in LibTorch, in one process.
//
// keel side:  configs/quickstart.toml loaded with keel::load_manifest and overrides that make
//             it run exactly N optimizer steps and nothing else (no evaluation, no checkpoint,
//             no hooks, one metrics record at the end that nobody receives). keel::Trainer is
//             constructed (data loaded, components created) outside the timed region; only
//             trainer.train() is timed.
// hand side:  the same MLP (torch::nn::Linear 784-256-128-10, ReLU, same seed so the same
//             initial weights), the same Fashion-MNIST tensors (read here from the same IDX
//             files, normalised the same way), the same per-epoch shuffle (randperm from a
//             generator seeded seed + epoch * 1000003) and index_select batches, AdamW, cosine
//             lr with linear warmup, cross entropy, torch::nn::utils::clip_grad_norm_,
//             gradients reset to undefined (set_to_none, as keel's optimizers do) and
//             loss.item() every step. Only the step loop (including the per-epoch shuffle) is
//             timed, as on the keel side.
//
// Both sides compute the same numbers, so the final losses are compared as a sanity check.
//
// Protocol: one warm-up run of each, then R rounds of one keel run and one hand run (the order
// alternates between rounds). Reports the median and min ms/step of each side and the ratio
// keel/hand.
//
// Usage: bench_loop [--steps N] [--repeats R] [--manifest PATH] [--out DIR] [--hand-zero MODE]
//   env: BENCH_STEPS, BENCH_REPEATS (argv wins). MODE: none (default, = keel) | inplace
//   (LibTorch 1.13's Optimizer::zero_grad(), which zeroes gradients in place; informational).
#include <ATen/CPUGeneratorImpl.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "error.hpp"
#include "manifest.hpp"
#include "registry.hpp"
#include "run_config.hpp"
#include "trainer.hpp"

#ifndef KEEL_SOURCE_ROOT
#define KEEL_SOURCE_ROOT "."
#endif

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  int64_t steps = 1500;
  int repeats = 7;
  std::string manifest = KEEL_SOURCE_ROOT "/configs/quickstart.toml";
  std::string out;  // run directory of the keel side; default /tmp/keel-bench-<pid>
  bool hand_zero_inplace = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "bench_loop: " << why
            << "\nusage: bench_loop [--steps N] [--repeats R] [--manifest PATH] [--out DIR] "
               "[--hand-zero none|inplace]\n  env: BENCH_STEPS, BENCH_REPEATS\n";
  std::exit(2);
}

int64_t to_int(const std::string& s, const char* what) {
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used != s.size() || v < 1) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    usage(std::string(what) + ": expected a positive integer, got '" + s + "'");
  }
}

Options parse(int argc, char** argv) {
  Options o;
  if (const char* e = std::getenv("BENCH_STEPS")) o.steps = to_int(e, "BENCH_STEPS");
  if (const char* e = std::getenv("BENCH_REPEATS"))
    o.repeats = static_cast<int>(to_int(e, "BENCH_REPEATS"));
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--steps") o.steps = to_int(value(), "--steps");
    else if (a == "--repeats") o.repeats = static_cast<int>(to_int(value(), "--repeats"));
    else if (a == "--manifest") o.manifest = value();
    else if (a == "--out") o.out = value();
    else if (a == "--hand-zero") {
      const std::string m = value();
      if (m != "none" && m != "inplace") usage("--hand-zero: none or inplace");
      o.hand_zero_inplace = m == "inplace";
    } else if (a == "-h" || a == "--help") usage("help");
    else usage("unknown argument '" + a + "'");
  }
  if (o.out.empty()) o.out = "/tmp/keel-bench-" + std::to_string(getpid());
  return o;
}

// ---------------------------------------------------------------------------------------------
// The quickstart's hyper-parameters, read from keel's resolved manifest (so both sides use the
// same values); the structural options the hand loop does not model are checked instead.

struct Hyper {
  uint64_t seed;
  std::string data_path;
  int64_t batch;
  std::vector<int64_t> hidden;
  double lr, beta1, beta2, eps, weight_decay;
  int64_t warmup;
  double max_norm;
};

template <class T>
T need(const toml::node_view<const toml::node>& v, const std::string& key) {
  auto x = v.value<T>();
  if (!x) throw std::runtime_error("bench: resolved manifest has no " + key);
  return *x;
}

void expect(bool ok, const std::string& what) {
  if (!ok)
    throw std::runtime_error("bench: the hand-written loop models the quickstart, but " + what +
                             "; update bench/bench_loop.cpp");
}

Hyper hyper_from(const keel::RunConfig& rc) {
  const toml::table& r = rc.resolved;
  Hyper h;
  h.seed = static_cast<uint64_t>(need<int64_t>(r["run"]["seed"], "run.seed"));
  const auto train = r["data"]["train"];
  expect(need<std::string>(train["type"], "data.train.type") == "fashion_mnist",
         "[data.train] is not fashion_mnist");
  expect(need<std::string>(train["split"], "split") == "train", "[data.train] split != train");
  expect(need<bool>(train["shuffle"], "shuffle"), "[data.train] does not shuffle");
  expect(!need<bool>(train["drop_last"], "drop_last"), "[data.train] drops the last batch");
  expect(need<bool>(train["normalize"], "normalize"), "[data.train] does not normalize");
  expect(need<int64_t>(train["limit"], "limit") == 0, "[data.train] sets a limit");
  h.data_path = need<std::string>(train["path"], "data.train.path");
  h.batch = need<int64_t>(train["batch_size"], "data.train.batch_size");

  const auto model = r["model"];
  expect(need<std::string>(model["type"], "model.type") == "mlp", "[model] is not mlp");
  expect(need<std::string>(model["activation"], "activation") == "relu", "activation != relu");
  expect(need<double>(model["dropout"], "dropout") == 0.0, "dropout != 0");
  expect(need<int64_t>(model["num_classes"], "num_classes") == 10, "num_classes != 10");
  const toml::array* in = model["input_shape"].as_array();
  const toml::array* hid = model["hidden"].as_array();
  expect(in && in->size() == 3, "input_shape is not [1, 28, 28]");
  for (size_t i = 0; i < 3; ++i)
    expect((*in)[i].value<int64_t>() == (i == 0 ? 1 : 28), "input_shape is not [1, 28, 28]");
  expect(hid && !hid->empty(), "hidden is empty");
  for (const auto& w : *hid) h.hidden.push_back(*w.value<int64_t>());

  const auto opt = r["optimizer"];
  expect(need<std::string>(opt["type"], "optimizer.type") == "adamw", "[optimizer] is not adamw");
  expect(!need<bool>(opt["amsgrad"], "amsgrad"), "amsgrad is on");
  h.lr = need<double>(opt["lr"], "optimizer.lr");
  h.beta1 = need<double>(opt["beta1"], "beta1");
  h.beta2 = need<double>(opt["beta2"], "beta2");
  h.eps = need<double>(opt["eps"], "eps");
  h.weight_decay = need<double>(opt["weight_decay"], "weight_decay");

  const auto sch = r["lr_scheduler"];
  expect(need<std::string>(sch["type"], "lr_scheduler.type") == "cosine", "lr is not cosine");
  expect(need<int64_t>(sch["total_steps"], "total_steps") == 0, "cosine total_steps is set");
  expect(need<double>(sch["min_factor"], "min_factor") == 0.0, "cosine min_factor != 0");
  h.warmup = need<int64_t>(sch["warmup_steps"], "warmup_steps");

  const auto loss = r["loss"];
  expect(need<std::string>(loss["type"], "loss.type") == "cross_entropy", "loss != cross_entropy");
  expect(need<double>(loss["label_smoothing"], "label_smoothing") == 0.0, "label smoothing on");

  const auto clip = r["grad_clipper"];
  expect(need<std::string>(clip["type"], "grad_clipper.type") == "norm", "clipper != norm");
  expect(need<double>(clip["norm_type"], "norm_type") == 2.0, "clip norm_type != 2");
  h.max_norm = need<double>(clip["max_norm"], "max_norm");
  return h;
}

// ---------------------------------------------------------------------------------------------
// Hand-written side.

std::vector<uint8_t> read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("bench: cannot open " + path);
  std::vector<uint8_t> out, chunk(1 << 16);
  int n = 0;
  while ((n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()))) > 0)
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  gzclose(f);
  if (n < 0) throw std::runtime_error("bench: cannot read " + path);
  return out;
}

struct Data {
  at::Tensor images;  // float [N, 1, 28, 28], (x / 255 - 0.2860) / 0.3530
  at::Tensor labels;  // int64 [N]
};

Data load_train(const std::string& dir) {
  std::vector<uint8_t> ib = read_gz(dir + "/train-images-idx3-ubyte.gz");
  std::vector<uint8_t> lb = read_gz(dir + "/train-labels-idx1-ubyte.gz");
  const int64_t n = static_cast<int64_t>(lb.size()) - 8;
  if (n <= 0 || ib.size() != static_cast<size_t>(16 + n * 28 * 28))
    throw std::runtime_error("bench: unexpected Fashion-MNIST file sizes in " + dir);
  auto u8 = at::TensorOptions().dtype(at::kByte);
  Data d;
  d.images = at::from_blob(ib.data() + 16, {n, 1, 28, 28}, u8).to(at::kFloat).div_(255);
  d.images.sub_(0.2860).div_(0.3530);
  d.labels = at::from_blob(lb.data() + 8, {n}, u8).to(at::kLong);
  return d;
}

struct MlpImpl : torch::nn::Module {
  std::vector<torch::nn::Linear> layers;
  explicit MlpImpl(const std::vector<int64_t>& hidden) {
    std::vector<int64_t> w = hidden;
    w.insert(w.begin(), 28 * 28);
    w.push_back(10);
    for (size_t i = 0; i + 1 < w.size(); ++i)
      layers.push_back(
          register_module("fc" + std::to_string(i + 1), torch::nn::Linear(w[i], w[i + 1])));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x.reshape({x.size(0), 28 * 28});
    for (size_t i = 0; i < layers.size(); ++i) {
      x = layers[i]->forward(x);
      if (i + 1 < layers.size()) x = torch::relu(x);
    }
    return x;
  }
};
TORCH_MODULE(Mlp);

double cosine_factor(int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t span = std::max<int64_t>(1, total - warmup);
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
  return 0.5 * (1.0 + std::cos(M_PI * progress));
}

struct RunResult {
  double ms_per_step;
  double last_loss;
};

RunResult hand_run(const Data& d, const Hyper& h, int64_t steps, bool zero_inplace) {
  torch::manual_seed(h.seed);
  Mlp model(h.hidden);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(h.lr)
                                                   .betas(std::make_tuple(h.beta1, h.beta2))
                                                   .eps(h.eps)
                                                   .weight_decay(h.weight_decay)
                                                   .amsgrad(false));
  std::vector<torch::Tensor> params = model->parameters();
  auto& group_opts = opt.param_groups()[0].options();
  const int64_t n = d.images.size(0);
  double last_loss = NAN;

  const auto t0 = Clock::now();
  model->train();
  int64_t step = 0;
  group_opts.set_lr(h.lr * cosine_factor(0, h.warmup, steps));
  for (int64_t epoch = 0; step < steps; ++epoch) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(h.seed + static_cast<uint64_t>(epoch) *
                                                                     1000003u);
    const torch::Tensor order = torch::randperm(n, gen, torch::TensorOptions(torch::kLong));
    for (int64_t cursor = 0; cursor < n && step < steps; cursor += h.batch) {
      const torch::Tensor idx = order.slice(0, cursor, std::min(cursor + h.batch, n));
      const torch::Tensor x = d.images.index_select(0, idx);
      const torch::Tensor y = d.labels.index_select(0, idx);

      if (zero_inplace)
        opt.zero_grad();
      else
        for (auto& p : params) p.mutable_grad() = torch::Tensor();
      const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      last_loss = loss.item<double>();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(params, h.max_norm);
      opt.step();
      ++step;
      if (step < steps) group_opts.set_lr(h.lr * cosine_factor(step, h.warmup, steps));
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  return {1e3 * secs / static_cast<double>(steps), last_loss};
}

// ---------------------------------------------------------------------------------------------
// keel side.

RunResult keel_run(const keel::RunConfig& rc, int64_t steps) {
  keel::Trainer trainer(rc);  // loads both splits and creates every component: not timed
  const auto t0 = Clock::now();
  const keel::RunSummary s = trainer.train();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (s.steps != steps)
    throw std::runtime_error("bench: keel ran " + std::to_string(s.steps) + " steps, expected " +
                             std::to_string(steps));
  return {1e3 * secs / static_cast<double>(steps), s.last_loss};
}

// CPU used by OTHER processes while the benchmark runs (in cores, averaged over the interval):
// the machine's busy time from /proc/stat minus this process's own CPU time. The ratio is only
// meaningful when this stays near 0.
class OtherLoad {
 public:
  OtherLoad() { sample(busy0_, wall0_, self0_); }
  double cores() const {
    double busy, wall, self;
    sample(busy, wall, self);
    if (wall <= wall0_) return 0;
    return std::max(0.0, (busy - busy0_) - (self - self0_)) / (wall - wall0_);
  }

 private:
  static void sample(double& busy, double& wall, double& self) {
    std::ifstream in("/proc/stat");
    std::string cpu;
    double user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    in >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq >> steal;
    const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
    busy = (user + nice + sys + irq + softirq + steal) / hz;
    wall = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    self = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
  }
  double busy0_ = 0, wall0_ = 0, self0_ = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  keel::configure_threads(0);  // both sides: every core for LibTorch, single-threaded BLAS

  const std::vector<std::string> overrides = {
      "train.epochs=0",
      "train.max_steps=" + std::to_string(o.steps),
      "train.eval_each_epoch=false",
      "train.log_every=1000000000000",
      "checkpoint.at_end=false",  // the [checkpoint] table stays, but nothing is ever saved
      "hooks=[]",                 // no console / jsonl hooks
      "run.output_dir=\"" + o.out + "\"",
  };
  keel::Registry registry;  // outlives every Trainer: the plugins stay loaded
  const keel::RunConfig rc = keel::resolve(keel::load_manifest(o.manifest, overrides), registry);
  if (!rc.hooks.empty() || rc.profiler || rc.mfu || rc.eval_each_epoch || rc.checkpoint_at_end ||
      rc.checkpoint_every_steps != 0 || rc.checkpoint_initial)
    throw std::runtime_error("bench: the keel run would do more than train steps");
  const Hyper h = hyper_from(rc);
  const Data data = load_train(h.data_path);

  std::printf("bench_loop: %s, %lld steps/run, %d rounds, batch %lld, %d intra-op threads, "
              "hand zero_grad: %s\n",
              o.manifest.c_str(), static_cast<long long>(o.steps), o.repeats,
              static_cast<long long>(h.batch), at::get_num_threads(),
              o.hand_zero_inplace ? "in place" : "set to none");

  const RunResult wk = keel_run(rc, o.steps);
  const RunResult wh = hand_run(data, h, o.steps, o.hand_zero_inplace);
  std::printf("  warm-up   keel %.4f ms/step  hand %.4f ms/step  (last loss keel %.6f, hand %.6f)\n",
              wk.ms_per_step, wh.ms_per_step, wk.last_loss, wh.last_loss);

  std::vector<double> keel_ms, hand_ms, ratios;
  double max_loss_diff = std::fabs(wk.last_loss - wh.last_loss);
  const OtherLoad total_other;
  double worst_other = 0;
  for (int r = 0; r < o.repeats; ++r) {
    const OtherLoad other;
    RunResult k{}, hr{};
    if (r % 2 == 0) {
      k = keel_run(rc, o.steps);
      hr = hand_run(data, h, o.steps, o.hand_zero_inplace);
    } else {
      hr = hand_run(data, h, o.steps, o.hand_zero_inplace);
      k = keel_run(rc, o.steps);
    }
    keel_ms.push_back(k.ms_per_step);
    hand_ms.push_back(hr.ms_per_step);
    ratios.push_back(k.ms_per_step / hr.ms_per_step);
    max_loss_diff = std::max(max_loss_diff, std::fabs(k.last_loss - hr.last_loss));
    const double busy = other.cores();
    worst_other = std::max(worst_other, busy);
    std::printf("  round %d%s  keel %.4f ms/step  hand %.4f ms/step  ratio %.4f  other load "
                "%.2f cores\n",
                r + 1, r % 2 ? " (hand first)" : "             ", k.ms_per_step, hr.ms_per_step,
                ratios.back(), busy);
    std::fflush(stdout);
  }
  std::error_code ec;
  fs::remove_all(o.out, ec);

  const double km = median(keel_ms), hm = median(hand_ms);
  const double kmin = *std::min_element(keel_ms.begin(), keel_ms.end());
  const double hmin = *std::min_element(hand_ms.begin(), hand_ms.end());
  std::printf("  keel ms/step: median %.4f  min %.4f\n", km, kmin);
  std::printf("  hand ms/step: median %.4f  min %.4f\n", hm, hmin);
  std::printf("  ratio of mins %.4f, median of per-round ratios %.4f, max |last loss keel - "
              "hand| %.3g\n",
              kmin / hmin, median(ratios), max_loss_diff);
  const double other_avg = total_other.cores();
  std::printf("  other processes used %.2f cores on average (worst round %.2f)\n", other_avg,
              worst_other);
  if (worst_other > 0.1)
    std::printf("  WARNING: the machine was not idle during the benchmark; the ratio is not "
                "reliable\n");
  std::printf("bench_loop: keel/hand step-time ratio (median of %d) = %.3f  [keel %.3f ms/step, "
              "hand %.3f ms/step]\n",
              o.repeats, km / hm, km, hm);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "bench_loop: " << e.what() << "\n";
  return 1;
}
