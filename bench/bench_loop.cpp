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
//             files, normalised the same way, and read again before every run, untimed, as
//             each keel run's Trainer loads its own), the same per-epoch shuffle (randperm from a
//             generator seeded seed + epoch * 1000003) and index_select batches, AdamW, cosine
//             lr with linear warmup, cross entropy, torch::nn::utils::clip_grad_norm_,
//             gradients reset to undefined (set_to_none, as keel's optimizers do) and
//             loss.item() every step. Only the step loop (including the per-epoch shuffle) is
//             timed, as on the keel side.
//
// Both sides compute the same numbers, so the final losses are compared as a sanity check.
//
// Protocol: one warm-up run of each, then C paired chunks: chunk i runs keel and the hand loop
// for N steps each, back to back on the same thread count (keel first in even chunks, hand
// first in odd ones), and gives one ratio keel ms/step / hand ms/step. The one statistic is the
// median of those paired ratios, with a 95% distribution-free confidence interval (the sign
// test's order statistics); the last line says whether the interval is narrow enough (at most
// 2% wide) to judge a 1% difference, and if so how keel compares with 1.01. Each run also
// records the CPU that other processes used meanwhile; pairs where that exceeds 0.05 cores are
// left out when at least 9 clean pairs remain.
//
// Usage: bench_loop [--steps N] [--chunks C] [--threads T] [--verbose] [--manifest PATH] [--out DIR]
//                   [--hand-zero MODE] [--hand-as-keel LIST] [--only keel|hand] [--set KEY=VALUE]...
//   N: steps per run (default 200), C: chunks (default 41), T: LibTorch intra-op threads of
//   both sides (default 0: one per core), --verbose: a line per chunk.
//   env: BENCH_STEPS, BENCH_CHUNKS (argv wins). MODE: none (default, = keel) | inplace
//   (LibTorch 1.13's Optimizer::zero_grad(), which zeroes gradients in place; informational).
//   --hand-as-keel: a comma-separated subset of seq, loss, clip, weights, or all (= loss,clip:
//   what keel does today): the hand loop does that part the way keel does or did it, to
//   attribute a keel/hand difference to a component (diagnostic). seq: the model as the mlp
//   plugin used to build it (nn::Sequential); loss: the cross_entropy plugin's checks and item
//   count (no ignore_index: numel); clip: the `norm` clipper's code; weights: the micro-batch
//   weighting the trainer no longer does for one micro-batch (count_items with a host sync,
//   loss * 1.0).
//   --set: an extra override for the keel side (after the bench's own), e.g.
//   --set train.accum_normalization=mean (diagnostic; the hand loop does not follow it).
//   --only: run one side only (a warm-up and C timed runs), e.g. under `perf record`.
#include <ATen/CPUGeneratorImpl.h>
#include <sys/resource.h>
#include <spdlog/spdlog.h>
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
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "error.hpp"
#include "log.hpp"
#include "machine_load.hpp"
#include "manifest.hpp"
#include "loader/registry.hpp"
#include "run_config.hpp"
#include "run/trainer.hpp"

#ifndef KEEL_SOURCE_ROOT
#define KEEL_SOURCE_ROOT "."
#endif

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

using keel_bench::OtherLoad;

struct Options {
  int64_t steps = 200;  // per chunk
  int repeats = 41;     // chunks (pairs of one keel and one hand run)
  bool verbose = false; // print every chunk
  int64_t threads = 0;  // LibTorch intra-op threads of both sides (0: one per core)
  std::string manifest = KEEL_SOURCE_ROOT "/configs/quickstart.toml";
  std::string out;  // run directory of the keel side; default /tmp/keel-bench-<pid>
  // Diagnostics (see Usage above): variants of the hand loop.
  struct Variant {
    bool zero_inplace = false;  // LibTorch's Optimizer::zero_grad() instead of set-to-none
    bool seq = false;           // the model as keel's mlp builds it: nn::Sequential
    bool loss = false;          // the loss as keel's cross_entropy computes it
    bool clip = false;          // the clipping as keel's `norm` clipper does it
    bool weights = false;       // the trainer's micro-batch weighting (count_items, loss * w)
  } hand;
  std::vector<std::string> sets;  // extra keel overrides (--set)
  std::string only;  // "keel" or "hand": run one side only (for profiling with perf)
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "bench_loop: " << why
            << "\nusage: bench_loop [--steps N] [--chunks C] [--threads T] [--verbose] [--manifest PATH] [--out DIR] "
               "[--hand-zero none|inplace] [--hand-as-keel seq,loss,clip,weights|all] [--only keel|hand] "
               "[--set KEY=VALUE]...\n  env: BENCH_STEPS, BENCH_CHUNKS\n";
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
  if (const char* e = std::getenv("BENCH_CHUNKS"))
    o.repeats = static_cast<int>(to_int(e, "BENCH_CHUNKS"));
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--steps") o.steps = to_int(value(), "--steps");
    else if (a == "--chunks") o.repeats = static_cast<int>(to_int(value(), "--chunks"));
    else if (a == "--verbose") o.verbose = true;
    else if (a == "--threads") o.threads = to_int(value(), "--threads");
    else if (a == "--manifest") o.manifest = value();
    else if (a == "--out") o.out = value();
    else if (a == "--hand-zero") {
      const std::string m = value();
      if (m != "none" && m != "inplace") usage("--hand-zero: none or inplace");
      o.hand.zero_inplace = m == "inplace";
    } else if (a == "--hand-as-keel") {
      std::string list = value() + ",";
      for (size_t at = 0, comma; (comma = list.find(',', at)) != std::string::npos;
           at = comma + 1) {
        const std::string item = list.substr(at, comma - at);
        if (item == "seq") o.hand.seq = true;
        else if (item == "loss") o.hand.loss = true;
        else if (item == "clip") o.hand.clip = true;
        else if (item == "weights") o.hand.weights = true;
        else if (item == "all") o.hand.loss = o.hand.clip = true;  // what keel does today
        else usage("--hand-as-keel: a comma-separated list of seq, loss, clip, weights, all");
      }
    } else if (a == "--set") {
      o.sets.push_back(value());
    } else if (a == "--only") {
      o.only = value();
      if (o.only != "keel" && o.only != "hand") usage("--only: keel or hand");
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

// As keel's mlp plugin: nn::Sequential of named Linear and ReLU modules (same creation order,
// so the same initial weights), with its input check.
torch::nn::Sequential sequential_mlp(const std::vector<int64_t>& hidden) {
  std::vector<int64_t> w = hidden;
  w.insert(w.begin(), 28 * 28);
  w.push_back(10);
  torch::nn::Sequential seq;
  for (size_t i = 0; i + 1 < w.size(); ++i) {
    seq->push_back("fc" + std::to_string(i + 1), torch::nn::Linear(w[i], w[i + 1]));
    if (i + 2 < w.size()) seq->push_back("act" + std::to_string(i + 1), torch::nn::ReLU());
  }
  return seq;
}

torch::Tensor sequential_forward(torch::nn::Sequential& seq, const torch::Tensor& input) {
  if (input.dim() < 1 || input.numel() != input.size(0) * 28 * 28)
    throw std::runtime_error("bench: bad input shape");
  return seq->forward(input.reshape({input.size(0), 28 * 28}));
}

// As keel's cross_entropy plugin (class-index targets).
torch::Tensor keel_style_loss(const torch::Tensor& output, const torch::Tensor& target,
                              int64_t* count) {
  // As the cross_entropy plugin with its defaults: no ignore_index (the plugin's sentinel, the
  // smallest int64), so every target counts and counting them is numel, with no host sync.
  namespace F = torch::nn::functional;
  static const auto options = F::CrossEntropyFuncOptions()
                                  .ignore_index(std::numeric_limits<int64_t>::min())
                                  .label_smoothing(0.0)
                                  .reduction(torch::kMean);
  std::vector<int64_t> expected = output.sizes().vec();
  if (!expected.empty()) expected.erase(expected.begin() + (expected.size() > 1 ? 1 : 0));
  if (target.sizes() != at::IntArrayRef(expected)) throw std::runtime_error("bench: bad target");
  const torch::Tensor labels = target.to(at::kLong);
  *count = labels.numel();
  return F::cross_entropy(output, labels, options);
}

// As keel's `norm` clipper (norm_type 2).
double keel_style_clip(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad().detach());
  if (grads.empty()) return 0.0;
  std::vector<torch::Tensor> norms;
  for (const auto& g : grads) norms.push_back(at::linalg_vector_norm(g, 2.0));
  const torch::Tensor total = at::linalg_vector_norm(at::stack(norms), 2.0);
  const torch::Tensor coef = ((total + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
  const double norm = total.item<double>();
  if (!(coef.item<double>() >= 1.0))  // a coefficient of 1: no pass over the gradients
    for (const auto& g : grads) g.mul_(coef);
  return norm;
}

double cosine_factor(int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t span = std::max<int64_t>(1, total - warmup);
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
  return 0.5 * (1.0 + std::cos(M_PI * progress));
}


struct RunResult {
  double ms_per_step;
  double last_loss;
  double other_load;  // cores used by other processes during the timed region
};

RunResult hand_run(const Data& d, const Hyper& h, int64_t steps, const Options::Variant& v) {
  torch::manual_seed(h.seed);
  Mlp model{nullptr};
  torch::nn::Sequential seq{nullptr};
  if (v.seq)
    seq = sequential_mlp(h.hidden);
  else
    model = Mlp(h.hidden);
  torch::nn::Module& module = v.seq ? static_cast<torch::nn::Module&>(*seq) : *model;
  torch::optim::AdamW opt(module.parameters(), torch::optim::AdamWOptions(h.lr)
                                                   .betas(std::make_tuple(h.beta1, h.beta2))
                                                   .eps(h.eps)
                                                   .weight_decay(h.weight_decay)
                                                   .amsgrad(false));
  std::vector<torch::Tensor> params = module.parameters();
  auto& group_opts = opt.param_groups()[0].options();
  const int64_t n = d.images.size(0);
  double last_loss = NAN;

  const OtherLoad other;
  const auto t0 = Clock::now();
  module.train();
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

      if (v.zero_inplace)
        opt.zero_grad();
      else
        for (auto& p : params) p.mutable_grad() = torch::Tensor();
      const torch::Tensor out = v.seq ? sequential_forward(seq, x) : model->forward(x);
      int64_t count = 0;
      torch::Tensor loss = v.loss ? keel_style_loss(out, y, &count)
                                  : torch::nn::functional::cross_entropy(out, y);
      if (v.weights) {
        // keel's Trainer: weight = items / total items of the step's micro-batches (1 here).
        const int64_t items = y.ne(-100).sum().item<int64_t>();
        loss = loss * (items > 0 ? static_cast<double>(items) / items : 0.0);
      }
      last_loss = loss.item<double>();
      loss.backward();
      if (v.clip)
        keel_style_clip(params, h.max_norm);
      else
        torch::nn::utils::clip_grad_norm_(params, h.max_norm);
      opt.step();
      ++step;
      if (step < steps) group_opts.set_lr(h.lr * cosine_factor(step, h.warmup, steps));
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  return {1e3 * secs / static_cast<double>(steps), last_loss, other.cores()};
}

// ---------------------------------------------------------------------------------------------
// keel side.

RunResult keel_run(const keel::RunConfig& rc, int64_t steps) {
  at::manual_seed(rc.run.seed);  // as keel::apply_process_settings does (threads are set in main)
  keel::Trainer trainer(rc);  // loads both splits and creates every component: not timed
  const OtherLoad other;
  const auto t0 = Clock::now();
  const keel::RunSummary s = trainer.train();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double busy = other.cores();
  if (s.steps != steps)
    throw std::runtime_error("bench: keel ran " + std::to_string(s.steps) + " steps, expected " +
                             std::to_string(steps));
  return {1e3 * secs / static_cast<double>(steps), s.last_loss, busy};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Linear-interpolated quantile q of sorted values.
double quantile(const std::vector<double>& sorted, double q) {
  const double at = q * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(at);
  if (i + 1 >= sorted.size()) return sorted.back();
  return sorted[i] + (at - static_cast<double>(i)) * (sorted[i + 1] - sorted[i]);
}

// The median of sorted values and a distribution-free confidence interval for it: the order
// statistics x(k) and x(n+1-k) with the largest k such that P(k <= B <= n-k) >= level for
// B ~ Binomial(n, 1/2) (the sign test's interval). `coverage` is that probability (below
// `level` when n is too small for any k: then the interval is [min, max]).
struct MedianCi {
  double median, low, high, coverage;
};
MedianCi median_ci(const std::vector<double>& sorted, double level) {
  const size_t n = sorted.size();
  // pmf of Binomial(n, 1/2), in log space for large n.
  std::vector<double> pmf(n + 1);
  for (size_t j = 0; j <= n; ++j)
    pmf[j] = std::exp(std::lgamma(n + 1.0) - std::lgamma(j + 1.0) - std::lgamma(n - j + 1.0) -
                      static_cast<double>(n) * std::log(2.0));
  size_t best_k = 1;
  double coverage = 1.0;  // k = 1: [x(1), x(n)] covers all but P(B = 0) + P(B = n)
  coverage = 1.0 - 2 * pmf[0];
  for (size_t k = 2; 2 * k <= n + 1; ++k) {
    // P(k <= B <= n-k) = 1 - 2 * P(B <= k-1)
    double tail = 0;
    for (size_t j = 0; j < k; ++j) tail += pmf[j];
    const double c = 1.0 - 2 * tail;
    if (c < level) break;
    best_k = k;
    coverage = c;
  }
  return {median(sorted), sorted[best_k - 1], sorted[n - best_k], coverage};
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  // keel's per-run log lines (e.g. the schedule's warm-up warning for short chunks) would
  // repeat once per chunk; --verbose keeps them. Through keel's logging, not spdlog's level
  // alone: each run attaches a run log, which sets up keel's console (at info) when nothing
  // else has.
  keel::init_logging(o.verbose ? spdlog::level::info : spdlog::level::err);
  // Both sides: the same LibTorch threads (default one per core), single-threaded BLAS.
  keel::configure_threads(o.threads);

  std::vector<std::string> overrides = {
      "train.epochs=0",
      "train.max_steps=" + std::to_string(o.steps),
      "train.eval_each_epoch=false",
      "train.log_every=1000000000000",
      "checkpoint.at_end=false",  // the [checkpoint] table stays, but nothing is ever saved
      "hooks=[]",                 // no console / jsonl hooks
      "run.mode=\"train\"",       // no evaluation (not even the final one when max_steps ends it)
      "run.output_dir=\"" + o.out + "\"",
  };
  overrides.insert(overrides.end(), o.sets.begin(), o.sets.end());
  keel::Registry registry;  // outlives every Trainer: the plugins stay loaded
  keel::RunConfig rc = keel::resolve(keel::load_manifest(o.manifest, overrides), registry);
  rc.overwrite = true;  // every run trains afresh into the same scratch output_dir
  if (!rc.hooks.empty() || rc.profiler || rc.mfu || rc.train.eval_each_epoch ||
      rc.run.mode != keel::RunMode::kTrain || rc.train.eval_every_steps != 0 ||
      rc.checkpointing.at_end || rc.checkpointing.every_steps != 0 || rc.checkpointing.initial ||
      rc.train.grad_accum != 1 || rc.train.precision != keel::Precision::kFp32)
    throw std::runtime_error("bench: the keel run would do more than train steps");
  const Hyper h = hyper_from(rc);
  // Each hand run gets data loaded just before it (untimed), as each keel run's Trainer loads
  // its own: on some VMs the first reads of freshly written memory are many times slower than
  // later ones (the 60,000 images' first epoch: bench/README.md), so data kept from earlier runs
  // would favour the hand loop.
  const auto fresh = [&] { return load_train(h.data_path); };

  std::printf("bench_loop: %s, %lld steps/run, %d chunks, batch %lld, %d intra-op threads, "
              "hand zero_grad: %s%s%s%s\n",
              o.manifest.c_str(), static_cast<long long>(o.steps), o.repeats,
              static_cast<long long>(h.batch), at::get_num_threads(),
              o.hand.zero_inplace ? "in place" : "set to none",
              o.hand.seq ? ", hand model: keel's Sequential" : "",
              o.hand.loss ? ", hand loss: keel's" : "", o.hand.clip ? ", hand clip: keel's" : "");

  std::printf("  keel overrides:");
  for (const auto& v : overrides) std::printf(" %s", v.c_str());
  std::printf("\n");

  if (!o.only.empty()) {
    // Profiling aid: R runs of one side, no comparison.
    std::vector<double> ms;
    for (int r = 0; r < o.repeats + 1; ++r) {
      const RunResult x = o.only == "keel" ? keel_run(rc, o.steps)
                                           : hand_run(fresh(), h, o.steps, o.hand);
      std::printf("  %s run %d  %.4f ms/step  other load %.2f cores\n", o.only.c_str(), r,
                  x.ms_per_step, x.other_load);
      if (r > 0) ms.push_back(x.ms_per_step);
    }
    std::error_code ec;
    fs::remove_all(o.out, ec);
    std::printf("bench_loop: %s only, median of %d = %.4f ms/step\n", o.only.c_str(), o.repeats,
                median(ms));
    return 0;
  }

  const RunResult wk = keel_run(rc, o.steps);
  const RunResult wh = hand_run(fresh(), h, o.steps, o.hand);
  std::printf("  warm-up   keel %.4f ms/step  hand %.4f ms/step  (last loss keel %.6f, hand %.6f)\n",
              wk.ms_per_step, wh.ms_per_step, wk.last_loss, wh.last_loss);

  // Paired chunks: chunk i runs keel and the hand loop back to back (the order alternates:
  // keel first in even chunks), each for `steps` steps on the same threads, and gives one ratio
  // keel/hand. Pairing cancels what drifts slower than a chunk (frequency, other load); the
  // median of the ratios, with a distribution-free confidence interval, is the one statistic.
  // Pairs where other processes used more than kIdle cores are reported and left out, as long
  // as at least kMinPairs clean pairs remain.
  constexpr double kIdle = 0.05;
  constexpr size_t kMinPairs = 9;
  struct Pair {
    RunResult keel, hand;
    bool clean() const { return keel.other_load <= kIdle && hand.other_load <= kIdle; }
    double ratio() const { return keel.ms_per_step / hand.ms_per_step; }
  };
  std::vector<Pair> pairs;
  double max_loss_diff = std::fabs(wk.last_loss - wh.last_loss);
  for (int r = 0; r < o.repeats; ++r) {
    Pair x{};
    if (r % 2 == 0) {
      x.keel = keel_run(rc, o.steps);
      x.hand = hand_run(fresh(), h, o.steps, o.hand);
    } else {
      x.hand = hand_run(fresh(), h, o.steps, o.hand);
      x.keel = keel_run(rc, o.steps);
    }
    pairs.push_back(x);
    max_loss_diff = std::max(max_loss_diff, std::fabs(x.keel.last_loss - x.hand.last_loss));
    if (o.verbose)
      std::printf("  chunk %3d%s  keel %.4f  hand %.4f ms/step  ratio %.4f  other load "
                  "%.2f/%.2f cores%s\n",
                  r + 1, r % 2 ? " (hand first)" : "             ", x.keel.ms_per_step,
                  x.hand.ms_per_step, x.ratio(), x.keel.other_load, x.hand.other_load,
                  x.clean() ? "" : "  (busy)");
    std::fflush(stdout);
  }
  std::error_code ec;
  fs::remove_all(o.out, ec);

  const size_t clean = std::count_if(pairs.begin(), pairs.end(),
                                     [](const Pair& x) { return x.clean(); });
  const bool only_clean = clean >= kMinPairs;
  std::vector<double> ratios, keel_ms, hand_ms;
  for (const Pair& x : pairs) {
    if (only_clean && !x.clean()) continue;
    ratios.push_back(x.ratio());
    keel_ms.push_back(x.keel.ms_per_step);
    hand_ms.push_back(x.hand.ms_per_step);
  }
  std::sort(ratios.begin(), ratios.end());
  const MedianCi ci = median_ci(ratios, 0.95);
  std::printf("  %zu of %zu pairs ran on an idle machine (other load <= %.2f cores)%s\n", clean,
              pairs.size(), kIdle,
              only_clean ? (clean < pairs.size() ? "; the statistic uses those" : "")
                         : "; too few: the statistic uses every pair");
  std::printf("  paired ratios: min %.4f  quartiles %.4f %.4f  max %.4f; keel %.4f ms/step, "
              "hand %.4f ms/step (medians); max |last loss keel - hand| %.3g\n",
              ratios.front(), quantile(ratios, 0.25), quantile(ratios, 0.75), ratios.back(),
              median(keel_ms), median(hand_ms), max_loss_diff);
  // An interval wholly on one side of 1.01 decides, however wide; one that contains 1.01 leaves
  // the target undecided, and is called too wide when it is wider than 2% (+-1%).
  std::string verdict;
  if (ci.coverage < 0.95)
    verdict = "too few pairs for a 95% interval: rerun with more --chunks";
  else if (ci.high < 1.0)
    verdict = "keel is within 1% of the hand loop (faster: the whole interval below 1.0)";
  else if (ci.high <= 1.01)
    verdict = "keel is within 1% of the hand loop";
  else if (ci.low > 1.01)
    verdict = "keel is more than 1% slower than the hand loop";
  else if (ci.high - ci.low > 0.02)
    verdict = "interval too wide to judge a 1% difference: rerun with more --chunks on an "
              "idle machine";
  else
    verdict = "the interval straddles 1.01: cannot tell whether keel is within 1%";
  std::printf("bench_loop: keel/hand step time, median of %zu paired ratios = %.4f, %.0f%% CI "
              "[%.4f, %.4f]: %s\n",
              ratios.size(), ci.median, 100 * ci.coverage, ci.low, ci.high, verdict.c_str());
  return 0;
} catch (const std::exception& e) {
  std::cerr << "bench_loop: " << e.what() << "\n";
  return 1;
}
