// Drives the components of the keel-ctr plugin (plugins/ctr) through keel/testing.hpp for
// tests/plugins/test_ctr.py. Files are raw arrays in this machine's byte order in a directory
// DIR that the test owns. Modes:
//
//   ctr_probe bce PLUGIN.so DIR N [M]
//     Loss bce on DIR/logits.bin (float32 [N], requiring grad) and DIR/labels.bin (float32
//     [M], default N): the loss, then its backward; DIR/grad.bin receives d(loss)/d(logits)
//     (float32).
//     stdout: {"loss": .., "count": .., "count_items": .., "no_grad_loss": ..}.
//
//   ctr_probe bce_eval PLUGIN.so DIR N BATCH
//     Two evaluations of loss bce as the kernel runs them (a zeroed state of metric_state_size
//     doubles, metric_update per batch, metric_finish): the first over DIR/scores.bin (float32
//     [N]) and DIR/labels.bin (float32 [N]) in batches of BATCH samples, the second over the
//     first BATCH samples alone. stdout: {"state_size": .., "first": {METRICS}, "second":
//     {METRICS}, "state": [the first evaluation's summed state]}.
//
//   ctr_probe bce_ranks PLUGIN.so DIR N WORLD
//     One evaluation of loss bce on WORLD ranks simulated in this process: WORLD instances,
//     rank r created with a fake keel_comm whose all_gather concatenates every rank's rows
//     (the instances meet in it from one thread each), rank r taking samples [N r / WORLD,
//     N (r + 1) / WORLD) of DIR/scores.bin and DIR/labels.bin (float32 [N]) in batches of 7;
//     the states summed over the ranks (as the kernel does), then every rank's metric_finish
//     at once. stdout: {"ranks": [{METRICS} for each rank]}.
//
//   ctr_probe dlrm PLUGIN.so DIR B B2 [KEY=VALUE]...
//     Model dlrm (seed 7, options KEY=VALUE) in training on DIR/inputs.bin (float64 [B, 39]):
//     logits = forward; then (logits * DIR/coef.bin (float32 [B])).sum() backward. Writes
//     DIR/logits.bin (float32 [B]), each parameter i (in the model's order) as DIR/p<i>.bin and
//     its gradient as DIR/g<i>.bin (float32), each table t's touched rows as DIR/t<t>_ids.bin
//     (int64 [n]), DIR/t<t>_values.bin and DIR/t<t>_grads.bin (float32 [n, dim]), and the
//     shared-table ids keel::EmbeddingTable::shared_id(f, id) of the inputs' ids as
//     DIR/sid.bin (int64 [B, 26]; -1 stays -1). Then every table's end_step(1), the model in
//     evaluation and, without grad, forward on DIR/inputs2.bin (float64 [B2, 39]):
//     DIR/eval_logits.bin (float32 [B2]) and DIR/sid2.bin. stdout: {"params": [{"name": ..,
//     "shape": [..]}, ..], "tables": [{"name": .., "dim": .., "rows": .., "touched": ..}, ..],
//     "flops": .., "output_shape": [..], "output_dtype": ..}.
//
//   ctr_probe dlrm_named PLUGIN.so DIR B B2 L [KEY=VALUE]...
//     The same through the model's named batches (keel.model.batch/1, forward_batch) on
//     multi-hot bags: DIR/dense.bin (float32 [B, 13]), DIR/ids.bin (int64 [B, L]) and
//     DIR/offsets.bin (int64 [B, 27]) in training, DIR/dense2.bin, ids2.bin, offsets2.bin
//     ([B2, ..]) in evaluation; DIR/sid.bin and sid2.bin (int64 [B, L]) hold the shared-table
//     id of each id in a bag (-1 outside the bags).
//
//   ctr_probe pool DIR N BAGS DIM sum|mean
//     keel::EmbeddingTable alone (name "t", dim DIM, seed 3, world 1) in training: out =
//     lookup(DIR/ids.bin (int64 [N]), DIR/offsets.bin (int64 [BAGS])), then (out *
//     DIR/coef.bin (float32 [BAGS, DIM])).sum() backward. Writes DIR/out.bin (float32 [BAGS,
//     DIM]), the touched rows as DIR/t0_ids.bin, t0_values.bin, t0_grads.bin (as above), and
//     the same lookup in evaluation as DIR/out_eval.bin. stdout: {"touched": n}.
#include "keel/embedding.hpp"
#include "keel/testing.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>

#include "probe.hpp"

#include <cmath>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace ctr_probe {

std::string json(double x) {
  if (std::isnan(x)) return "NaN";
  char text[64];
  std::snprintf(text, sizeof(text), "%.17g", x);
  return text;
}

at::Tensor read_tensor(const std::string& path, std::vector<int64_t> shape, at::ScalarType type) {
  std::vector<char> bytes = probe::read_file(path);
  const at::Tensor t = at::from_blob(bytes.data(), shape, type).clone();
  if (static_cast<size_t>(t.nbytes()) != bytes.size())
    throw std::runtime_error(path + ": " + std::to_string(bytes.size()) + " bytes, expected " +
                             std::to_string(t.nbytes()));
  return t;
}

void write_tensor(const std::string& path, const at::Tensor& tensor) {
  const at::Tensor t = tensor.detach().contiguous();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  if (!f.flush()) throw std::runtime_error("cannot write " + path);
}

// ---- bce ----------------------------------------------------------------------------------

std::string bce_mode(int argc, char** argv) {
  if (argc != 5 && argc != 6)
    throw std::runtime_error("usage: ctr_probe bce PLUGIN.so DIR N [M]");
  keel::testing::Plugin plugin(probe::open_plugin(argv[2]));
  const std::string dir = argv[3];
  const int64_t n = std::stoll(argv[4]);
  const at::Tensor logits = read_tensor(dir + "/logits.bin", {n}, at::kFloat).requires_grad_(true);
  const int64_t m = argc == 6 ? std::stoll(argv[5]) : n;
  const at::Tensor labels = read_tensor(dir + "/labels.bin", {m}, at::kFloat);
  auto loss = plugin.create<keel_loss>("bce");
  keel_tensor* out = nullptr;
  int64_t count = -1;
  loss.call(loss->compute, keel::peek(logits), keel::peek(labels), &out, &count);
  const at::Tensor l = keel::adopt(out);
  double no_grad_loss = 0;
  {
    at::NoGradGuard no_grad;
    keel_tensor* again = nullptr;
    int64_t again_count = -1;
    loss.call(loss->compute, keel::peek(logits), keel::peek(labels), &again, &again_count);
    no_grad_loss = keel::adopt(again).item<double>();
  }
  l.backward();
  write_tensor(dir + "/grad.bin", logits.grad());
  const int64_t items = loss.call(loss->count_items, keel::peek(labels));
  return probe::format("{\"loss\": %s, \"count\": %lld, \"count_items\": %lld, "
                       "\"no_grad_loss\": %s}\n",
                       json(l.item<double>()).c_str(), static_cast<long long>(count),
                       static_cast<long long>(items), json(no_grad_loss).c_str());
}

// A keel_metric_writer collecting "key": value pairs as JSON members.
struct Writer {
  keel_metric_writer abi{};
  std::string members;
  Writer() {
    abi.struct_size = sizeof abi;
    abi.host_data = this;
    abi.put = [](keel_metric_writer* w, const char* key, double value) -> int {
      auto* self = static_cast<Writer*>(w->host_data);
      self->members += (self->members.empty() ? "" : ", ") + probe::json_string(key) + ": " +
                       json(value);
      return 1;
    };
  }
};

// One evaluation of `loss` over scores/labels in batches of `batch`: returns the metrics as a
// JSON object and leaves the summed state in `state`.
std::string evaluate(const keel::testing::Instance<keel_loss>& loss, const at::Tensor& scores,
                     const at::Tensor& labels, int64_t batch, std::vector<double>& state) {
  std::fill(state.begin(), state.end(), 0.0);  // as the kernel does before an evaluation
  at::NoGradGuard no_grad;
  for (int64_t b = 0; b < scores.size(0); b += batch) {
    const at::Tensor s = scores.slice(0, b, b + batch), y = labels.slice(0, b, b + batch);
    keel_tensor* out = nullptr;
    int64_t count = -1;
    loss.call(loss->compute, keel::peek(s), keel::peek(y), &out, &count);
    const double value = keel::adopt(out).item<double>();
    loss.call(loss->metric_update, keel::peek(s), keel::peek(y), value, count, state.data(),
              state.size());
  }
  Writer w;
  loss.call(loss->metric_finish, static_cast<const double*>(state.data()), state.size(), &w.abi);
  return "{" + w.members + "}";
}

std::string bce_eval_mode(int argc, char** argv) {
  if (argc != 6) throw std::runtime_error("usage: ctr_probe bce_eval PLUGIN.so DIR N BATCH");
  keel::testing::Plugin plugin(probe::open_plugin(argv[2]));
  const std::string dir = argv[3];
  const int64_t n = std::stoll(argv[4]), batch = std::stoll(argv[5]);
  const at::Tensor scores = read_tensor(dir + "/scores.bin", {n}, at::kFloat);
  const at::Tensor labels = read_tensor(dir + "/labels.bin", {n}, at::kFloat);
  auto loss = plugin.create<keel_loss>("bce");
  const size_t size = loss.call(loss->metric_state_size);
  std::vector<double> state(size), first_state;
  const std::string first = evaluate(loss, scores, labels, batch, state);
  first_state = state;
  const std::string second =
      evaluate(loss, scores.slice(0, 0, batch), labels.slice(0, 0, batch), batch, state);
  std::string summed;
  for (double v : first_state) summed += (summed.empty() ? "" : ", ") + json(v);
  return probe::format("{\"state_size\": %zu, \"first\": %s, \"second\": %s, \"state\": [%s]}\n",
                       size, first.c_str(), second.c_str(), summed.c_str());
}

// ---- bce on several ranks -----------------------------------------------------------------

// A keel_comm for WORLD ranks of one process, one thread per rank: all_gather waits until every
// rank has sent, then hands each the rows of all in rank order. (all_to_all: not needed here.)
struct FakeWorld {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<at::Tensor> sent;
  int arrived = 0;
  int64_t round = 0;
};
struct FakeComm {
  keel_comm abi{};
  FakeWorld* world = nullptr;
};

keel_status fake_all_gather(const keel_comm* comm, keel_tensor* send, keel_tensor** recv,
                            int64_t* rows, keel_error* /*err*/) {
  FakeWorld& w = *static_cast<const FakeComm*>(comm->host_data)->world;
  std::unique_lock<std::mutex> lock(w.mu);
  w.sent[comm->rank] = keel::borrow(send).clone();
  const int64_t round = w.round;
  if (++w.arrived == comm->world_size) {
    w.arrived = 0;
    ++w.round;
    w.cv.notify_all();
  } else {
    w.cv.wait(lock, [&] { return w.round != round; });
  }
  for (int r = 0; r < comm->world_size; ++r) rows[r] = w.sent[r].size(0);
  *recv = keel::give(at::cat(w.sent, 0));
  return KEEL_OK;
}

std::string bce_ranks_mode(int argc, char** argv) {
  if (argc != 6) throw std::runtime_error("usage: ctr_probe bce_ranks PLUGIN.so DIR N WORLD");
  keel::testing::Plugin plugin(probe::open_plugin(argv[2]));
  const std::string dir = argv[3];
  const int64_t n = std::stoll(argv[4]);
  const int world = std::stoi(argv[5]);
  const at::Tensor scores = read_tensor(dir + "/scores.bin", {n}, at::kFloat);
  const at::Tensor labels = read_tensor(dir + "/labels.bin", {n}, at::kFloat);
  // keel::testing::Setup has no comm: the factory is called here as Plugin::create calls it,
  // with the harness's own option checks and host, and a fake comm.
  const keel_component_desc& c = plugin.component(KEEL_KIND_LOSS, "bce");
  const auto options = keel::testing::detail::check_options(c, {}, "loss");
  FakeWorld fake;
  fake.sent.resize(world);
  std::vector<FakeComm> comms(world);
  std::vector<keel_loss*> losses(world, nullptr);
  std::vector<double> summed(3, 0.0);
  for (int r = 0; r < world; ++r) {
    comms[r].abi = {sizeof(keel_comm), &comms[r], r, world, nullptr, fake_all_gather};
    comms[r].world = &fake;
    keel_create_context ctx{};
    ctx.struct_size = sizeof ctx;
    ctx.host = keel::testing::detail::host();
    ctx.options = options.get();
    ctx.section = "loss";
    ctx.rank = r;
    ctx.world_size = world;
    ctx.run_dir = dir.c_str();
    ctx.comm = &comms[r].abi;
    keel_error err;
    err.message[0] = '\0';
    void* out = nullptr;
    if (c.create(&ctx, &out, &err) != KEEL_OK) throw std::runtime_error(err.message);
    losses[r] = static_cast<keel_loss*>(out);
    std::vector<double> state(3, 0.0);
    at::NoGradGuard no_grad;
    for (int64_t b = n * r / world; b < n * (r + 1) / world; b += 7) {
      const int64_t e = std::min(b + 7, n * (r + 1) / world);
      const at::Tensor sb = scores.slice(0, b, e), yb = labels.slice(0, b, e);
      if (losses[r]->metric_update(losses[r]->self, keel::peek(sb), keel::peek(yb), 0.0, e - b,
                                   state.data(), state.size(), &err) != KEEL_OK)
        throw std::runtime_error(err.message);
    }
    for (size_t i = 0; i < 3; ++i) summed[i] += state[i];
  }
  std::vector<Writer> writers(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      keel_error err;
      err.message[0] = '\0';
      if (losses[r]->metric_finish(losses[r]->self, summed.data(), summed.size(),
                                   &writers[r].abi, &err) != KEEL_OK)
        errors[r] = err.message;
    });
  for (std::thread& t : threads) t.join();
  std::string ranks;
  for (int r = 0; r < world; ++r) {
    losses[r]->destroy(losses[r]->self);
    if (!errors[r].empty())
      throw std::runtime_error("rank " + std::to_string(r) + ": " + errors[r]);
    ranks += (r ? ", {" : "{") + writers[r].members + "}";
  }
  return "{\"ranks\": [" + ranks + "]}\n";
}

// ---- dlrm and the embedding table -----------------------------------------------------------

// probe::parse_options, plus int lists: a value "[a, b, ..]" ("[]": empty).
keel::testing::Options parse_options(int argc, char** argv, int first) {
  keel::testing::Options lists;
  std::vector<char*> rest(argv, argv + first);
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (eq == std::string::npos || a.compare(eq + 1, 1, "[") != 0) {
      rest.push_back(argv[i]);
      continue;
    }
    std::vector<int64_t> values;
    std::stringstream s(a.substr(eq + 2));
    for (std::string e; std::getline(s, e, ',');)
      if (e.find_first_of("0123456789") != std::string::npos) values.push_back(std::stoll(e));
    lists.emplace_back(a.substr(0, eq), values);
  }
  keel::testing::Options out =
      probe::parse_options(static_cast<int>(rest.size()), rest.data(), first);
  out.insert(out.end(), lists.begin(), lists.end());
  return out;
}

// Table `t`'s touched rows as DIR/t<index>_{ids,values,grads}.bin; returns how many.
size_t write_touched(const keel_sparse_table* t, const std::string& dir, size_t index) {
  keel_sparse_rows rows{};
  rows.struct_size = sizeof rows;
  keel_error err;
  err.message[0] = '\0';
  if (t->touched(t->self, &rows, &err) != KEEL_OK)
    throw std::runtime_error(std::string("touched: ") + err.message);
  const int64_t n = static_cast<int64_t>(rows.count), dim = t->dim;
  at::Tensor ids = at::empty({n}, at::kLong), values = at::empty({n, dim}, at::kFloat),
             grads = at::empty({n, dim}, at::kFloat);
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = rows.ids[i];
    std::memcpy(values[i].data_ptr<float>(), rows.values[i], sizeof(float) * dim);
    std::memcpy(grads[i].data_ptr<float>(), rows.grads[i], sizeof(float) * dim);
  }
  const std::string stem = dir + "/t" + std::to_string(index);
  write_tensor(stem + "_ids.bin", ids);
  write_tensor(stem + "_values.bin", values);
  write_tensor(stem + "_grads.bin", grads);
  return rows.count;
}

// The shared-table ids of inputs' categorical columns, int64 [B, 26].
at::Tensor shared_ids(const at::Tensor& inputs) {
  const at::Tensor ids = inputs.slice(1, 13, 39).to(at::kLong).contiguous();
  at::Tensor out = at::empty_like(ids);
  for (int64_t b = 0; b < ids.size(0); ++b)
    for (int64_t f = 0; f < 26; ++f)
      out[b][f] = keel::EmbeddingTable::shared_id(f, ids[b][f].item<int64_t>());
  return out;
}

std::string shape_json(at::IntArrayRef sizes) {
  std::string out;
  for (int64_t s : sizes) out += (out.empty() ? "" : ", ") + std::to_string(s);
  return "[" + out + "]";
}

// The shared-table ids of the ids in bags (named batch), int64 [B, L]; -1 outside the bags.
at::Tensor shared_bag_ids(const at::Tensor& ids, const at::Tensor& offsets) {
  at::Tensor out = at::full(ids.sizes(), -1, at::kLong);
  for (int64_t b = 0; b < ids.size(0); ++b)
    for (int64_t f = 0; f < 26; ++f)
      for (int64_t k = offsets[b][f].item<int64_t>(); k < offsets[b][f + 1].item<int64_t>(); ++k)
        out[b][k] = keel::EmbeddingTable::shared_id(f, ids[b][k].item<int64_t>());
  return out;
}

std::string dlrm_mode(int argc, char** argv) {
  const bool named = std::string(argv[1]) == "dlrm_named";
  const int first_option = named ? 7 : 6;
  if (argc < first_option)
    throw std::runtime_error("usage: ctr_probe dlrm PLUGIN.so DIR B B2 [KEY=VALUE]... or "
                             "ctr_probe dlrm_named PLUGIN.so DIR B B2 L [KEY=VALUE]...");
  keel::testing::Plugin plugin(probe::open_plugin(argv[2]));
  const std::string dir = argv[3];
  const int64_t b = std::stoll(argv[4]), b2 = std::stoll(argv[5]);
  const int64_t l = named ? std::stoll(argv[6]) : 0;
  // The training and evaluation batches: columns (inputs.bin) or named (dense, ids, offsets).
  auto batch_of = [&](const std::string& suffix, int64_t n) -> keel::testing::NamedTensors {
    if (!named)
      return {{"inputs", read_tensor(dir + "/inputs" + suffix + ".bin", {n, 39}, at::kDouble)}};
    return {{"dense", read_tensor(dir + "/dense" + suffix + ".bin", {n, 13}, at::kFloat)},
            {"sparse_ids", read_tensor(dir + "/ids" + suffix + ".bin", {n, l}, at::kLong)},
            {"sparse_offsets", read_tensor(dir + "/offsets" + suffix + ".bin", {n, 27}, at::kLong)}};
  };
  const keel::testing::NamedTensors batch = batch_of("", b), batch2 = batch_of("2", b2);
  const at::Tensor coef = read_tensor(dir + "/coef.bin", {b}, at::kFloat);
  keel::testing::Setup setup;
  setup.seed = 7;
  auto model = plugin.create<keel_model>("dlrm", parse_options(argc, argv, first_option), setup);
  keel_tensor* o = nullptr;
  auto forward = [&](const keel::testing::NamedTensors& in) {
    if (named) {
      const keel::testing::NamedTensors out = keel::testing::forward_batch(model, in);
      const at::Tensor* y = keel::find(out, "logits");
      if (y == nullptr) throw std::runtime_error("forward_batch put no logits");
      return *y;
    }
    model.call(model->forward, keel::peek(in[0].second), &o);
    return keel::adopt(o);
  };
  auto shared = [&](const keel::testing::NamedTensors& in) {
    return named ? shared_bag_ids(in[1].second, in[2].second) : shared_ids(in[0].second);
  };
  model.call(model->set_training, 1);
  const at::Tensor logits = forward(batch);
  (logits * coef).sum().backward();
  write_tensor(dir + "/logits.bin", logits);
  std::string params;
  const size_t np = model.call(model->param_count);
  for (size_t i = 0; i < np; ++i) {
    const char* name = nullptr;
    keel_tensor* t = nullptr;
    model.call(model->param, i, &name, &t);
    const at::Tensor p = keel::borrow(t);
    write_tensor(dir + "/p" + std::to_string(i) + ".bin", p);
    write_tensor(dir + "/g" + std::to_string(i) + ".bin", p.grad());
    params += std::string(params.empty() ? "" : ", ") + "{\"name\": " + probe::json_string(name) +
              ", \"shape\": " + shape_json(p.sizes()) + "}";
  }
  std::vector<const keel_sparse_table*> tables(model.call(model->table_count));
  std::string listed;
  for (size_t i = 0; i < tables.size(); ++i) {
    tables[i] = model.call(model->table, i);
    const size_t touched = write_touched(tables[i], dir, i);
    keel_table_stats stats{};
    stats.struct_size = sizeof stats;
    tables[i]->stats(tables[i]->self, &stats);
    listed += probe::format("%s{\"name\": %s, \"dim\": %lld, \"rows\": %lld, \"touched\": %zu}",
                            listed.empty() ? "" : ", ", probe::json_string(tables[i]->name).c_str(),
                            static_cast<long long>(tables[i]->dim),
                            static_cast<long long>(stats.rows), touched);
    keel_error err;
    err.message[0] = '\0';
    if (tables[i]->end_step(tables[i]->self, 1, &err) != KEEL_OK)
      throw std::runtime_error(std::string("end_step: ") + err.message);
  }
  write_tensor(dir + "/sid.bin", shared(batch));
  write_tensor(dir + "/sid2.bin", shared(batch2));
  model.call(model->set_training, 0);
  {
    at::NoGradGuard no_grad;
    write_tensor(dir + "/eval_logits.bin", forward(batch2));
  }
  return probe::format("{\"params\": [%s], \"tables\": [%s], \"flops\": %s, "
                       "\"output_shape\": %s, \"output_dtype\": \"%s\"}\n",
                       params.c_str(), listed.c_str(),
                       json(model.call(model->flops_per_sample)).c_str(),
                       shape_json(logits.sizes()).c_str(), c10::toString(logits.scalar_type()));
}

std::string pool_mode(int argc, char** argv) {
  if (argc != 7) throw std::runtime_error("usage: ctr_probe pool DIR N BAGS DIM sum|mean");
  const std::string dir = argv[2];
  const int64_t n = std::stoll(argv[3]), bags = std::stoll(argv[4]), dim = std::stoll(argv[5]);
  const keel::Pooling pooling =
      std::string(argv[6]) == "mean" ? keel::Pooling::kMean : keel::Pooling::kSum;
  const at::Tensor ids = read_tensor(dir + "/ids.bin", {n}, at::kLong);
  const at::Tensor offsets = read_tensor(dir + "/offsets.bin", {bags}, at::kLong);
  const at::Tensor coef = read_tensor(dir + "/coef.bin", {bags, dim}, at::kFloat);
  keel::TableOptions options;
  options.name = "t";
  options.dim = dim;
  options.seed = 3;
  keel::EmbeddingTable table(options, nullptr);
  table.set_training(true);
  const at::Tensor out = table.lookup(ids, offsets, pooling);
  (out * coef).sum().backward();
  write_tensor(dir + "/out.bin", out);
  const size_t touched = write_touched(table.abi(), dir, 0);
  table.set_training(false);
  {
    at::NoGradGuard no_grad;
    write_tensor(dir + "/out_eval.bin", table.lookup(ids, offsets, pooling));
  }
  return probe::format("{\"touched\": %zu}\n", touched);
}

std::string run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "bce") return bce_mode(argc, argv);
  if (mode == "bce_eval") return bce_eval_mode(argc, argv);
  if (mode == "bce_ranks") return bce_ranks_mode(argc, argv);
  if (mode == "dlrm" || mode == "dlrm_named") return dlrm_mode(argc, argv);
  if (mode == "pool") return pool_mode(argc, argv);
  throw std::runtime_error(
      "usage: ctr_probe bce|bce_eval|bce_ranks|dlrm|dlrm_named|pool ... (see ctr_probe.cpp)");
}

int entry(int argc, char** argv) { return probe::main_guard(run, argc, argv); }

}  // namespace ctr_probe
