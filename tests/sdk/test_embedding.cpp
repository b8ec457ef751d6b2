// keel::EmbeddingTable (sdk/include/keel/embedding.hpp, libkeel-embedding) in one process:
// deterministic rows, admission and eviction, pooling and gradients against at::embedding_bag,
// duplicate ids, grad_accum, checkpoints at the same and another world size, max_rows, and
// sharded lookups over a fake keel_comm whose ranks are threads of this process.
#include <doctest/doctest.h>

#include <ATen/ops/allclose.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/embedding_bag.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "keel/embedding.hpp"
#include "keel/tensor.hpp"

namespace {

using keel::EmbeddingTable;
using keel::Pooling;
using keel::TableOptions;
using Entries = std::vector<std::pair<std::string, at::Tensor>>;

TableOptions options(const std::string& name, int64_t dim = 4) {
  TableOptions o;
  o.name = name;
  o.dim = dim;
  o.init_std = 0.5;
  o.seed = 42;
  return o;
}

at::Tensor longs(std::vector<int64_t> v) {
  return at::tensor(at::ArrayRef<int64_t>(v), at::kLong).clone();
}

// ---- the keel_sparse_table slots as C++ calls ------------------------------------------------

std::string call(keel_status s, const keel_error& err) {
  return s == KEEL_OK ? "" : std::string(err.message);
}

// The step's gradients by id, from either form of keel_sparse_rows (host pointers, or tensors
// when the table's rows_as_tensors is set).
std::map<int64_t, std::vector<float>> grads_of(EmbeddingTable& t) {
  keel_sparse_rows rows{};
  rows.struct_size = sizeof(rows);
  keel_error err{};
  const keel_sparse_table* a = t.abi();
  REQUIRE(call(a->touched(a->self, &rows, &err), err) == "");
  std::map<int64_t, std::vector<float>> out;
  at::Tensor g;
  if (a->rows_as_tensors) {
    CHECK(rows.grads == nullptr);
    if (rows.count > 0) g = keel::borrow(rows.row_grads).cpu().contiguous();
  }
  for (size_t i = 0; i < rows.count; ++i) {
    REQUIRE(out.count(rows.ids[i]) == 0);  // distinct ids
    const float* row = g.defined() ? g.data_ptr<float>() + i * a->dim : rows.grads[i];
    out[rows.ids[i]].assign(row, row + a->dim);
  }
  return out;
}

void end_step(EmbeddingTable& t, int64_t step) {
  keel_error err{};
  const keel_sparse_table* a = t.abi();
  REQUIRE(call(a->end_step(a->self, step, &err), err) == "");
}

Entries save(EmbeddingTable& t) {
  Entries out;
  keel_state_writer w{};
  w.struct_size = sizeof(w);
  w.host_data = &out;
  w.put = [](keel_state_writer* self, const char* name, keel_tensor* tensor) -> int {
    static_cast<Entries*>(self->host_data)->emplace_back(name, keel::borrow(tensor).clone());
    return 1;
  };
  keel_error err{};
  const keel_sparse_table* a = t.abi();
  REQUIRE(call(a->save(a->self, &w, &err), err) == "");
  return out;
}

std::string load(EmbeddingTable& t, const Entries& entries) {
  std::vector<keel_named_tensor> named;
  for (const auto& e : entries) named.push_back({e.first.c_str(), keel::peek(e.second)});
  keel_error err{};
  const keel_sparse_table* a = t.abi();
  return call(a->load(a->self, named.data(), named.size(), &err), err);
}

at::Tensor entry(const Entries& entries, const std::string& name) {
  for (const auto& e : entries)
    if (e.first == name) return e.second;
  return at::Tensor();
}

// ---- a fake keel_comm: the ranks are threads of this process ------------------------------

struct FakeWorld {
  struct Link {
    FakeWorld* world;
    int rank;
  };
  explicit FakeWorld(int n) : size(n), sends(n), rows(n), links(n), comms(n) {
    for (int r = 0; r < n; ++r) {
      links[r] = {this, r};
      comms[r].struct_size = sizeof(keel_comm);
      comms[r].host_data = &links[r];
      comms[r].rank = r;
      comms[r].world_size = n;
      comms[r].all_to_all = &FakeWorld::all_to_all;
      comms[r].all_gather = nullptr;
    }
  }
  int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  int64_t generation = 0;
  int64_t calls = 0;
  std::vector<at::Tensor> sends;
  std::vector<std::vector<int64_t>> rows;
  std::vector<Link> links;
  std::vector<keel_comm> comms;

  bool barrier(std::unique_lock<std::mutex>& lock) {
    const int64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return true;
    }
    return cv.wait_for(lock, std::chrono::seconds(20), [&] { return generation != gen; });
  }

  static keel_status all_to_all(const keel_comm* c, keel_tensor* send, const int64_t* send_rows,
                                keel_tensor** recv, int64_t* recv_rows, keel_error* err) {
    const Link* l = static_cast<const Link*>(c->host_data);
    FakeWorld& w = *l->world;
    std::unique_lock<std::mutex> lock(w.mu);
    w.sends[l->rank] = keel::borrow(send);
    w.rows[l->rank].assign(send_rows, send_rows + w.size);
    if (l->rank == 0) ++w.calls;
    if (!w.barrier(lock)) {
      std::snprintf(err->message, KEEL_ERROR_CAPACITY, "fake all_to_all: timed out");
      return KEEL_ERR;
    }
    std::vector<at::Tensor> pieces;
    for (int s = 0; s < w.size; ++s) {
      int64_t off = 0;
      for (int k = 0; k < l->rank; ++k) off += w.rows[s][k];
      pieces.push_back(w.sends[s].narrow(0, off, w.rows[s][l->rank]));
      recv_rows[s] = w.rows[s][l->rank];
    }
    *recv = keel::give(at::cat(pieces).contiguous());
    w.barrier(lock);  // nobody deposits the next call's rows before everyone read these
    return KEEL_OK;
  }
};

// Runs body(rank) on one thread per rank; rethrows the first failure.
void run_ranks(int n, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> failed(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        failed[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& f : failed)
    if (f) std::rethrow_exception(f);
}

// One training step's lookup and backward: loss = sum(out * weights) * scale.
at::Tensor train_lookup(EmbeddingTable& t, const at::Tensor& ids, const at::Tensor& offsets,
                        Pooling pooling, const at::Tensor& weights, double scale = 1.0) {
  at::Tensor out = t.lookup(ids, offsets, pooling);
  REQUIRE(out.requires_grad());
  (out * weights).sum().mul(scale).backward();
  return out.detach();
}

}  // namespace

TEST_CASE("rows start from (seed, name, id) alone") {
  const std::vector<int64_t> ids = {5, 1, 77, 1234567890123LL, 0, 9};
  std::vector<int64_t> reversed(ids.rbegin(), ids.rend());
  EmbeddingTable a(options("t"), nullptr), b(options("t"), nullptr);
  a.lookup(longs(ids), longs({0}), Pooling::kSum);
  for (int64_t id : reversed) b.lookup(longs({id}), longs({0}), Pooling::kSum);
  const at::Tensor va = a.read(longs(ids)), vb = b.read(longs(ids));
  CHECK(at::equal(va, vb));
  CHECK(va.abs().sum().item<float>() > 0);
  struct Case {
    const char* what;
    TableOptions opt;
  };
  TableOptions other_seed = options("t"), other_name = options("u");
  other_seed.seed = 43;
  for (const Case& c : {Case{"another seed", other_seed}, Case{"another name", other_name}}) {
    CAPTURE(c.what);
    EmbeddingTable t(c.opt, nullptr);
    t.lookup(longs(ids), longs({0}), Pooling::kSum);
    CHECK(!at::equal(t.read(longs(ids)), va));
  }
  // N(0, init_std^2): 2000 rows x 8 values.
  TableOptions wide = options("stats", 8);
  wide.init_std = 0.1;
  EmbeddingTable s(wide, nullptr);
  std::vector<int64_t> many;
  for (int64_t i = 0; i < 2000; ++i) many.push_back(i * 7919);
  s.lookup(longs(many), longs({0}), Pooling::kSum);
  const at::Tensor v = s.read(longs(many));
  CHECK(std::abs(v.mean().item<double>()) < 0.005);
  CHECK(std::abs(v.std().item<double>() - 0.1) < 0.005);
}

TEST_CASE("pooling and gradients match at::embedding_bag on the same rows") {
  struct Case {
    const char* what;
    Pooling pooling;
    std::vector<int64_t> ids, offsets;
    int64_t min_count;
  };
  const Case cases[] = {
      {"sum, one id a bag", Pooling::kSum, {3, 8, 3, 11}, {0, 1, 2, 3}, 1},
      {"sum, duplicates and an empty bag", Pooling::kSum, {3, 3, 8, 9, 3}, {0, 2, 2, 5}, 1},
      {"mean, duplicates and an empty bag", Pooling::kMean, {3, 3, 8, 9, 3}, {0, 2, 2, 5}, 1},
      {"sum, missing ids", Pooling::kSum, {-1, 4, -7, 4, 5, -1}, {0, 1, 3, 5}, 1},
      {"mean, missing ids", Pooling::kMean, {-1, 4, -7, 4, 5, -1}, {0, 1, 3, 5}, 1},
      // min_count 2: ids seen once read zeros but count in the mean's divisor
      {"mean, ids not admitted", Pooling::kMean, {1, 2, 2, 3, 1, 4}, {0, 3, 4}, 2},
      {"sum, ids not admitted", Pooling::kSum, {1, 2, 2, 3, 1, 4}, {0, 3, 4}, 2},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    TableOptions o = options("bag", 3);
    o.min_count = c.min_count;
    EmbeddingTable t(o, nullptr);
    const at::Tensor weights = at::randn({static_cast<int64_t>(c.offsets.size()), 3});
    const at::Tensor out = train_lookup(t, longs(c.ids), longs(c.offsets), c.pooling, weights);
    // The reference: a dense weight holding the table's rows (zeros for ids without one),
    // the missing ids left out of the bags.
    std::vector<int64_t> distinct, index, offsets;
    std::map<int64_t, int64_t> at;
    for (size_t b = 0; b < c.offsets.size(); ++b) {
      offsets.push_back(static_cast<int64_t>(index.size()));
      const size_t end = b + 1 < c.offsets.size() ? c.offsets[b + 1] : c.ids.size();
      for (size_t p = c.offsets[b]; p < end; ++p) {
        if (c.ids[p] < 0) continue;
        if (!at.count(c.ids[p])) {
          at[c.ids[p]] = static_cast<int64_t>(distinct.size());
          distinct.push_back(c.ids[p]);
        }
        index.push_back(at[c.ids[p]]);
      }
    }
    at::Tensor dense = t.read(longs(distinct)).clone();
    dense.set_requires_grad(true);
    const int64_t mode = c.pooling == Pooling::kSum ? 0 : 1;
    const at::Tensor ref = std::get<0>(
        at::embedding_bag(dense, longs(index), longs(offsets), false, mode));
    CHECK(at::allclose(out, ref.detach(), 1e-6, 1e-6));
    (ref * weights).sum().backward();
    const auto grads = grads_of(t);
    std::set<int64_t> admitted;
    for (size_t k = 0; k < distinct.size(); ++k) {
      const bool has_row = t.read(longs({distinct[k]})).abs().sum().item<float>() > 0;
      if (!has_row) {
        CHECK(grads.count(distinct[k]) == 0);  // no row: no gradient
        continue;
      }
      admitted.insert(distinct[k]);
      REQUIRE(grads.count(distinct[k]) == 1);
      const at::Tensor want = dense.grad()[k];
      const at::Tensor got = at::tensor(at::ArrayRef<float>(grads.at(distinct[k])));
      CHECK(at::allclose(got, want, 1e-6, 1e-6));
    }
    CHECK(grads.size() == admitted.size());
    if (c.min_count == 2) CHECK(admitted == std::set<int64_t>{1, 2});  // sighted twice
  }
}

TEST_CASE("duplicate ids merge; grad_accum adds; end_step forgets") {
  EmbeddingTable t(options("acc", 2), nullptr);
  const at::Tensor w1 = longs({1, 2}).to(at::kFloat).view({2, 1}).expand({2, 2}).contiguous();
  // Step 1, two micro-batches: id 7 twice in the first, once in the second.
  train_lookup(t, longs({7, 7, 8}), longs({0, 2}), Pooling::kSum, w1);
  auto g = grads_of(t);
  REQUIRE(g.size() == 2);
  CHECK(g[7] == std::vector<float>{2, 2});  // bag 0 holds id 7 twice, weight 1
  CHECK(g[8] == std::vector<float>{2, 2});
  train_lookup(t, longs({8, 7}), longs({0, 1}), Pooling::kSum, w1);
  g = grads_of(t);
  CHECK(g[7] == std::vector<float>{4, 4});
  CHECK(g[8] == std::vector<float>{3, 3});
  end_step(t, 1);
  CHECK(grads_of(t).empty());
  CHECK(t.current_step() == 2);
}

TEST_CASE("evaluation: no sightings, no rows, no gradients; unknown ids read zeros") {
  TableOptions o = options("eval", 2);
  o.min_count = 2;
  EmbeddingTable t(o, nullptr);
  t.lookup(longs({1, 1}), longs({0}), Pooling::kSum);  // admitted: two sightings
  t.lookup(longs({2}), longs({0}), Pooling::kSum);     // pending: one
  t.set_training(false);
  for (int i = 0; i < 3; ++i) {
    const at::Tensor out = t.lookup(longs({1, 2, 3}), longs({0, 1, 2}), Pooling::kSum);
    CHECK(!out.requires_grad());
    CHECK(at::equal(out[0], t.read(longs({1}))[0]));
    CHECK(out[1].abs().sum().item<float>() == 0);
    CHECK(out[2].abs().sum().item<float>() == 0);
  }
  CHECK(t.stats().rows == 1);
  CHECK(entry(save(t), "pending_counts").sum().item<int64_t>() == 1);  // id 2's one sighting
  t.set_training(true);
  t.lookup(longs({2}), longs({0}), Pooling::kSum);
  CHECK(t.stats().rows == 2);
}

TEST_CASE("admission at the min_count-th sighting and ttl eviction, counted") {
  struct Case {
    int64_t min_count, ttl;
    // ids looked up in steps 1, 2, ... (one lookup a step)
    std::vector<std::vector<int64_t>> steps;
    std::vector<int64_t> rows, admitted, evicted;  // stats after each end_step
  };
  const Case cases[] = {
      {1, 0, {{1, 2}, {3}, {}, {}}, {2, 3, 3, 3}, {2, 3, 3, 3}, {0, 0, 0, 0}},
      {3, 0, {{1, 2}, {1}, {1, 2, 2}, {2}}, {0, 0, 2, 2}, {0, 0, 2, 2}, {0, 0, 0, 0}},
      // ttl 2: a row not looked up in steps s-1 and s goes at end_step(s)
      {1, 2, {{1, 2}, {1}, {}, {}, {2}}, {2, 2, 1, 0, 1}, {2, 2, 2, 2, 3}, {0, 0, 1, 2, 2}},
      // ttl 1, min_count 2: id 2's one sighting in step 1 is forgotten at end_step(2), so
      // steps 3 and 4 admit it, not step 3 alone
      {2, 1, {{1, 1, 2}, {}, {2}, {2}}, {1, 0, 0, 1}, {1, 1, 1, 2}, {0, 1, 1, 1}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.min_count);
    CAPTURE(c.ttl);
    TableOptions o = options("life", 2);
    o.min_count = c.min_count;
    o.ttl_steps = c.ttl;
    EmbeddingTable t(o, nullptr);
    for (size_t s = 0; s < c.steps.size(); ++s) {
      CAPTURE(s + 1);
      std::vector<int64_t> offsets(c.steps[s].size());
      for (size_t k = 0; k < offsets.size(); ++k) offsets[k] = static_cast<int64_t>(k);
      if (!c.steps[s].empty())
        t.lookup(longs(c.steps[s]), longs(offsets), Pooling::kSum);
      end_step(t, static_cast<int64_t>(s) + 1);
      const keel_table_stats st = t.stats();
      CHECK(st.rows == c.rows[s]);
      CHECK(st.admitted == c.admitted[s]);
      CHECK(st.evicted == c.evicted[s]);
    }
  }
}

TEST_CASE("an evicted row comes back as new: initial values, zero slots") {
  TableOptions o = options("again", 2);
  o.ttl_steps = 1;
  EmbeddingTable t(o, nullptr);
  keel_error err{};
  const keel_sparse_table* a = t.abi();
  REQUIRE(call(a->reserve_slots(a->self, 3, &err), err) == "");
  CHECK(call(a->reserve_slots(a->self, 3, &err), err).find("called twice") != std::string::npos);
  train_lookup(t, longs({4}), longs({0}), Pooling::kSum, at::ones({1, 2}));
  const at::Tensor initial = t.read(longs({4})).clone();
  keel_sparse_rows rows{};
  rows.struct_size = sizeof(rows);
  REQUIRE(call(a->touched(a->self, &rows, &err), err) == "");
  REQUIRE(rows.count == 1);
  REQUIRE(rows.slot_width == 3);
  for (int j = 0; j < 2; ++j) rows.values[0][j] += 1.0f;  // an optimizer's update
  for (int j = 0; j < 3; ++j) rows.slots[0][j] = 5.0f;
  end_step(t, 1);
  end_step(t, 2);  // not looked up in step 2: evicted
  CHECK(t.stats().evicted == 1);
  CHECK(t.stats().rows == 0);
  train_lookup(t, longs({4}), longs({0}), Pooling::kSum, at::ones({1, 2}));
  CHECK(at::equal(t.read(longs({4})), initial));
  REQUIRE(call(a->touched(a->self, &rows, &err), err) == "");
  REQUIRE(rows.count == 1);
  for (int j = 0; j < 3; ++j) CHECK(rows.slots[0][j] == 0.0f);
  CHECK(t.stats().admitted == 2);
}

TEST_CASE("slots reserved after rows exist: values kept, slots zero") {
  EmbeddingTable t(options("late", 3), nullptr);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 5000; ++i) ids.push_back(i);  // more than one block of rows
  train_lookup(t, longs(ids), longs({0}), Pooling::kSum, at::ones({1, 3}));
  const at::Tensor before = t.read(longs(ids)).clone();
  keel_error err{};
  REQUIRE(call(t.abi()->reserve_slots(t.abi()->self, 2, &err), err) == "");
  CHECK(at::equal(t.read(longs(ids)), before));
  keel_sparse_rows rows{};
  rows.struct_size = sizeof(rows);
  REQUIRE(call(t.abi()->touched(t.abi()->self, &rows, &err), err) == "");
  REQUIRE(rows.count == 5000);
  float slot_sum = 0;
  for (size_t i = 0; i < rows.count; ++i) slot_sum += rows.slots[i][0] + rows.slots[i][1];
  CHECK(slot_sum == 0.0f);
  CHECK(rows.values[4999][2] == before[4999][2].item<float>());
}

TEST_CASE("max_rows: a clear error naming the table, the limit and a hint") {
  TableOptions o = options("capped", 2);
  o.max_rows = 3;
  EmbeddingTable t(o, nullptr);
  t.lookup(longs({1, 2, 3}), longs({0}), Pooling::kSum);
  std::string message = "<no error>";
  try {
    t.lookup(longs({1, 4}), longs({0}), Pooling::kSum);
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  CHECK(message.find("embedding table 'capped'") != std::string::npos);
  CHECK(message.find("max_rows = 3") != std::string::npos);
  CHECK(message.find("hint:") != std::string::npos);
}

// issue 43, finding 10: with min_count = 2 every id sighted once waited for ever (3.1 M of them,
// +211 MB, with max_rows = 1000). Here 7 new ids a step, each sighted once, for 100 steps.
TEST_CASE("pending ids stay bounded: past max_pending the oldest steps' are forgotten") {
  const auto waiting = [](EmbeddingTable& t) { return entry(save(t), "pending_ids").numel(); };
  const auto step_ids = [](int64_t s) {
    std::vector<int64_t> ids;
    for (int64_t k = 0; k < 7; ++k) ids.push_back(s * 1000 + k);
    return ids;
  };
  TableOptions o = options("pend", 2);
  o.min_count = 2;
  o.max_rows = 10;  // max_pending 0 (the default): 4 x max_rows = 40 ids may wait
  EmbeddingTable t(o, nullptr);
  int64_t most = 0;
  for (int64_t s = 1; s <= 100; ++s) {
    t.lookup(longs(step_ids(s)), longs({0}), Pooling::kSum);
    end_step(t, s);
    most = std::max(most, waiting(t));
  }
  CHECK(most <= 40);
  CHECK(t.stats().rows == 0);
  CHECK(t.stats().pending == waiting(t));  // the records' table_pending (ABI 1.10)
  CHECK(t.stats().pending == t.pending());
  // What waits is the newest whole steps' ids: past 40 (at the end of steps 6, 10, .., 98) the
  // newest whole steps within 20 ids stay (2 steps, 14 ids), so at step 100 steps 97 .. 100.
  const at::Tensor left = entry(save(t), "pending_last_seen");
  CHECK(left.numel() == 28);
  CHECK(left.min().item<int64_t>() == 97);
  // A waiting id's second sighting admits it; a forgotten one's counts as its first.
  t.lookup(longs({100 * 1000 + 3, 1 * 1000 + 3}), longs({0}), Pooling::kSum);
  CHECK(t.stats().rows == 1);
}

// The forgetting depends on the saved state alone: a run saved at step 50 and loaded goes on
// exactly as the uninterrupted one.
TEST_CASE("forgetting pending ids is exact across save and load") {
  TableOptions o = options("pend_exact", 2);
  o.min_count = 3;
  o.max_rows = 50;  // 200 may wait
  const auto step = [](EmbeddingTable& t, int64_t s) {
    std::vector<int64_t> ids;
    for (int64_t k = 0; k < 5 + s % 4; ++k) ids.push_back((s * 7 + k * 13) % 400 + 1000 * (s % 3));
    t.lookup(longs(ids), longs({0}), Pooling::kSum);
    end_step(t, s);
  };
  EmbeddingTable whole(o, nullptr), first(o, nullptr), second(o, nullptr);
  for (int64_t s = 1; s <= 120; ++s) step(whole, s);
  for (int64_t s = 1; s <= 50; ++s) step(first, s);
  REQUIRE(load(second, save(first)) == "");
  for (int64_t s = 51; s <= 120; ++s) step(second, s);
  const Entries a = save(whole), b = save(second);
  REQUIRE(a.size() == b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    CAPTURE(a[k].first);
    CHECK(at::equal(a[k].second, b[k].second));
  }
  CHECK(entry(a, "pending_ids").numel() <= 200);
}

TEST_CASE("bad options and arguments are one clear error") {
  struct Case {
    const char* what;
    std::function<void()> body;
    const char* expect;
  };
  const Case cases[] = {
      {"empty name", [] { EmbeddingTable t(options(""), nullptr); }, "the name must be"},
      {"name with a space", [] { EmbeddingTable t(options("a b"), nullptr); }, "the name must be"},
      {"dim 0", [] { EmbeddingTable t(options("d", 0), nullptr); }, "dim must be >= 1"},
      {"a device neither the CPU nor CUDA",
       [] {
         TableOptions o = options("m");
         o.device = at::Device(at::kMeta);
         EmbeddingTable t(o, nullptr);
       },
       "device must be the CPU or a CUDA device, not meta"},
      {"offsets not from 0",
       [] {
         EmbeddingTable t(options("o"), nullptr);
         t.lookup(longs({1, 2}), longs({1}), Pooling::kSum);
       },
       "offsets must start at 0"},
      {"offsets past the ids",
       [] {
         EmbeddingTable t(options("o"), nullptr);
         t.lookup(longs({1, 2}), longs({0, 3}), Pooling::kSum);
       },
       "offsets must start at 0"},
      {"2-D ids",
       [] {
         EmbeddingTable t(options("o"), nullptr);
         t.lookup(longs({1, 2}).view({1, 2}), longs({0}), Pooling::kSum);
       },
       "must be 1-D"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    std::string message = "<no error>";
    try {
      c.body();
    } catch (const std::exception& e) {
      message = e.what();
    }
    CHECK(message.find(c.expect) != std::string::npos);
  }
}

TEST_CASE("shared_id: per-feature ids, >= 0, missing stays missing") {
  std::set<int64_t> seen;
  for (int64_t f = 0; f < 26; ++f)
    for (int64_t id = 0; id < 200; ++id) {
      const int64_t s = EmbeddingTable::shared_id(f, id);
      CHECK(s >= 0);
      seen.insert(s);
    }
  CHECK(seen.size() == 26 * 200);
  CHECK(EmbeddingTable::shared_id(3, -1) == -1);
  CHECK(EmbeddingTable::shared_id(3, 5) == EmbeddingTable::shared_id(3, 5));
}

TEST_CASE("save -> load restores rows, slots, pending sightings and counters") {
  TableOptions o = options("ckpt", 3);
  o.min_count = 2;
  o.ttl_steps = 10;
  EmbeddingTable t(o, nullptr);
  keel_error err{};
  REQUIRE(call(t.abi()->reserve_slots(t.abi()->self, 2, &err), err) == "");
  train_lookup(t, longs({1, 1, 2, 2, 3, 4}), longs({0, 3}), Pooling::kMean, at::ones({2, 3}));
  keel_sparse_rows rows{};
  rows.struct_size = sizeof(rows);
  REQUIRE(call(t.abi()->touched(t.abi()->self, &rows, &err), err) == "");
  for (size_t i = 0; i < rows.count; ++i) rows.slots[i][1] = static_cast<float>(rows.ids[i]);
  end_step(t, 1);
  const Entries saved = save(t);
  EmbeddingTable u(o, nullptr);
  REQUIRE(call(u.abi()->reserve_slots(u.abi()->self, 2, &err), err) == "");
  REQUIRE(load(u, saved) == "");
  CHECK(u.current_step() == 2);
  CHECK(at::equal(u.read(longs({1, 2, 3, 4})), t.read(longs({1, 2, 3, 4}))));
  CHECK(u.stats().rows == 2);
  CHECK(u.stats().admitted == 2);
  const Entries again = save(u);
  REQUIRE(again.size() == saved.size());
  for (size_t k = 0; k < saved.size(); ++k) {
    CAPTURE(saved[k].first);
    CHECK(again[k].first == saved[k].first);
    CHECK(at::equal(again[k].second, saved[k].second));
  }
  CHECK(at::equal(entry(saved, "slots").select(1, 1), longs({1, 2}).to(at::kFloat)));
  // id 3 had one sighting before the save: one more admits it
  u.lookup(longs({3}), longs({0}), Pooling::kSum);
  CHECK(u.stats().rows == 3);
  // entries the table cannot use
  struct Bad {
    const char* what;
    Entries entries;
    const char* expect;
  };
  Entries extra = saved, no_slots, wrong = saved;
  extra.emplace_back("bogus", longs({1}));
  for (const auto& e : saved)
    if (e.first != "slots") no_slots.push_back(e);
  for (auto& e : wrong)
    if (e.first == "values") e.second = at::zeros({2, 5});
  for (const Bad& b : {Bad{"unknown entry", extra, "unknown checkpoint entry 'bogus'"},
                       Bad{"no slots", no_slots, "no entry 'slots'"},
                       Bad{"another dim", wrong, "entry 'values' is"}}) {
    CAPTURE(b.what);
    EmbeddingTable v(o, nullptr);
    REQUIRE(call(v.abi()->reserve_slots(v.abi()->self, 2, &err), err) == "");
    CHECK(load(v, b.entries).find(b.expect) != std::string::npos);
  }
}

TEST_CASE("checkpoints reload at another world size: each rank keeps the ids it owns") {
  TableOptions o = options("reshard", 2);
  o.min_count = 2;
  EmbeddingTable one(o, nullptr);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 60; ++i) ids.push_back(i * 31 + 1);
  one.lookup(longs(ids), longs({0}), Pooling::kSum);                      // pending
  one.lookup(longs(ids), longs({0}), Pooling::kSum);                      // admitted
  one.lookup(longs({1000, 2000, 3000}), longs({0}), Pooling::kSum);       // pending
  end_step(one, 1);
  const Entries whole = save(one);
  // 1 rank -> 2 ranks: the world-1 part loaded on rank 0 and rank 1.
  FakeWorld world(2);
  std::vector<std::unique_ptr<EmbeddingTable>> ranks;
  int64_t rows = 0, admitted = 0, pending = 0;
  std::vector<Entries> parts;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<EmbeddingTable>(o, &world.comms[r]));
    REQUIRE(load(*ranks[r], whole) == "");
    const Entries part = save(*ranks[r]);
    parts.push_back(part);
    const at::Tensor kept = entry(part, "ids");
    for (int64_t k = 0; k < kept.numel(); ++k)
      CHECK(EmbeddingTable::owner(kept[k].item<int64_t>(), 2) == r);
    CHECK(at::equal(ranks[r]->read(kept), one.read(kept)));
    rows += ranks[r]->stats().rows;
    admitted += ranks[r]->stats().admitted;
    pending += entry(part, "pending_ids").numel();
    CHECK(ranks[r]->current_step() == 2);
  }
  CHECK(rows == 60);
  CHECK(admitted == 60);  // the count continues on one rank, not on both
  CHECK(pending == 3);
  CHECK(ranks[0]->stats().rows > 10);  // the hash spreads the ids
  CHECK(ranks[1]->stats().rows > 10);
  // 2 ranks -> 1 rank: both parts loaded in turn.
  EmbeddingTable back(o, nullptr);
  REQUIRE(load(back, parts[0]) == "");
  REQUIRE(load(back, parts[1]) == "");
  CHECK(back.stats().rows == 60);
  CHECK(back.stats().admitted == 60);
  const Entries round = save(back);
  for (const char* name : {"ids", "values", "last_seen", "pending_ids", "pending_counts"}) {
    CAPTURE(name);
    CHECK(at::equal(entry(round, name), entry(whole, name)));
  }
  CHECK(load(back, parts[0]).find("in two loaded parts") != std::string::npos);
}

// issue 43, finding 12: an id twice within one saved part was called "in two loaded parts".
TEST_CASE("a saved part holding an id twice: one error naming the id, nothing loaded") {
  TableOptions o = options("dup", 2);
  o.min_count = 2;
  EmbeddingTable t(o, nullptr);
  t.lookup(longs({1, 1, 2, 2, 3, 3, 8}), longs({0}), Pooling::kSum);  // rows 1, 2, 3; 8 waits
  end_step(t, 1);
  const Entries saved = save(t);
  Entries rows_twice = saved, pending_twice = saved;
  for (auto& e : rows_twice)
    if (e.first == "ids") e.second = longs({1, 3, 3});
  for (auto& e : pending_twice)
    if (e.first == "pending_ids" || e.first == "pending_counts" ||
        e.first == "pending_last_seen")
      e.second = longs({e.first == "pending_ids" ? 9 : 1, e.first == "pending_ids" ? 9 : 1});
  struct Bad {
    const char* what;
    Entries entries;
    const char* expect;
  };
  for (const Bad& b : {Bad{"a row's id", rows_twice, "id 3 is twice in the part's ids"},
                       Bad{"a pending id", pending_twice, "id 9 is twice in the part's "
                                                          "pending_ids"}}) {
    CAPTURE(b.what);
    EmbeddingTable u(o, nullptr);
    const std::string message = load(u, b.entries);
    CHECK(message.find("embedding table 'dup'") != std::string::npos);
    CHECK(message.find(b.expect) != std::string::npos);
    CHECK(message.find("two loaded parts") == std::string::npos);
    CHECK(u.stats().rows == 0);  // nothing of the part was kept
    CHECK(entry(save(u), "pending_ids").numel() == 0);
  }
  // The same part loaded twice is still called so.
  EmbeddingTable v(o, nullptr);
  REQUIRE(load(v, saved) == "");
  CHECK(load(v, saved).find("in two loaded parts") != std::string::npos);
}

TEST_CASE("2 ranks over a fake comm match 1 rank with the same global batch") {
  // Global batch: 6 bags of 2 ids (ids repeat across the halves, some once only); rank r takes
  // bags [3r, 3r + 3). Loss per rank: sum(out * w) over its bags; 1 rank: the mean of the two.
  const std::vector<int64_t> ids = {1, 2, 3, 3, 4, 5, 1, 6, 3, 7, 8, -1};
  const at::Tensor w = at::randn({6, 4});
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
    CAPTURE(static_cast<int>(pooling));
    TableOptions o = options("sharded", 4);
    o.min_count = 2;
    EmbeddingTable one(o, nullptr);
    at::Tensor offsets_all = longs({0, 2, 4, 6, 8, 10});
    const at::Tensor out1 = train_lookup(one, longs(ids), offsets_all, pooling, w, 0.5);
    const auto g1 = grads_of(one);
    FakeWorld world(2);
    std::vector<std::unique_ptr<EmbeddingTable>> tables;
    for (int r = 0; r < 2; ++r)
      tables.push_back(std::make_unique<EmbeddingTable>(o, &world.comms[r]));
    std::vector<at::Tensor> outs(2);
    run_ranks(2, [&](int r) {
      const std::vector<int64_t> mine(ids.begin() + 6 * r, ids.begin() + 6 * r + 6);
      outs[r] = train_lookup(*tables[r], longs(mine), longs({0, 2, 4}), pooling,
                             w.narrow(0, 3 * r, 3));
    });
    CHECK(world.calls == 3);  // ids, rows, gradients
    CHECK(at::allclose(at::cat(outs), out1, 1e-6, 1e-6));
    std::map<int64_t, std::vector<float>> g2;
    int64_t rows = 0;
    for (int r = 0; r < 2; ++r) {
      rows += tables[r]->stats().rows;
      for (const auto& kv : grads_of(*tables[r])) {
        CHECK(EmbeddingTable::owner(kv.first, 2) == r);
        g2[kv.first] = kv.second;
      }
    }
    CHECK(rows == one.stats().rows);
    REQUIRE(g2.size() == g1.size());
    for (const auto& kv : g1) {
      CAPTURE(kv.first);
      REQUIRE(g2.count(kv.first) == 1);
      for (size_t j = 0; j < kv.second.size(); ++j)
        CHECK(g2[kv.first][j] == doctest::Approx(kv.second[j]).epsilon(1e-5));
    }
    // Evaluation exchanges too, and reads the same rows.
    for (auto& t : tables) t->set_training(false);
    one.set_training(false);
    const at::Tensor e1 = one.lookup(longs(ids), offsets_all, pooling);
    run_ranks(2, [&](int r) {
      const std::vector<int64_t> mine(ids.begin() + 6 * r, ids.begin() + 6 * r + 6);
      outs[r] = tables[r]->lookup(longs(mine), longs({0, 2, 4}), pooling);
    });
    CHECK(at::allclose(at::cat(outs), e1, 1e-6, 1e-6));
  }
}

// The tensor-operation path (TableOptions::tensor_ops, the one a table in device memory takes)
// against the host path, both on the CPU: over steps of training lookups (duplicate and
// negative ids, two lookups a step, admission at the 2nd sighting, eviction after 2 steps
// without a lookup, so rows are reused), an update of the touched rows through keel_sparse_rows
// (host pointers, or rows as tensors written back at end_step) and evaluation lookups, alone
// and on 2 ranks of a fake comm, the outputs, the step's gradients and the saved entries are
// equal (at::equal: the same sums in the same order).
TEST_CASE("tensor operations give the host path's values exactly") {
  // w -= 0.1 * g on the touched rows; slot += g^2: through the pointers, or (rows as tensors) on
  // the tensors, which the table writes back at end_step.
  const auto update = [](EmbeddingTable& t) {
    keel_sparse_rows rows{};
    rows.struct_size = sizeof(rows);
    keel_error err{};
    const keel_sparse_table* a = t.abi();
    REQUIRE(call(a->touched(a->self, &rows, &err), err) == "");
    if (a->rows_as_tensors) {
      CHECK((rows.values == nullptr && rows.slots == nullptr));
      if (rows.count == 0) return;
      const at::Tensor g = keel::borrow(rows.row_grads);
      keel::borrow(rows.row_values).sub_(g * 0.1f);
      keel::borrow(rows.row_slots).add_(g * g);
      return;
    }
    for (size_t i = 0; i < rows.count; ++i)
      for (int64_t j = 0; j < a->dim; ++j) {
        rows.values[i][j] -= 0.1f * rows.grads[i][j];
        rows.slots[i][j] += rows.grads[i][j] * rows.grads[i][j];
      }
  };
  const auto reserve = [](EmbeddingTable& t) {
    keel_error err{};
    const keel_sparse_table* a = t.abi();
    REQUIRE(call(a->reserve_slots(a->self, static_cast<size_t>(a->dim), &err), err) == "");
  };
  for (int world : {1, 2}) {
    for (Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
      CAPTURE(world);
      CAPTURE(static_cast<int>(pooling));
      TableOptions o = options("paths", 3);
      o.min_count = 2;
      o.ttl_steps = 2;
      std::vector<std::unique_ptr<EmbeddingTable>> host, tensors;  // per rank
      FakeWorld fake_host(world), fake_tensors(world);
      for (int r = 0; r < world; ++r) {
        TableOptions t = o;
        t.tensor_ops = true;
        host.push_back(std::make_unique<EmbeddingTable>(o, world > 1 ? &fake_host.comms[r]
                                                                     : nullptr));
        tensors.push_back(std::make_unique<EmbeddingTable>(t, world > 1 ? &fake_tensors.comms[r]
                                                                        : nullptr));
        reserve(*host[r]);
        reserve(*tensors[r]);
        CHECK(host[r]->abi()->rows_as_tensors == 0);
        CHECK(tensors[r]->abi()->rows_as_tensors == 1);
        CHECK(std::string(tensors[r]->abi()->device) == "cpu");
      }
      for (int64_t step = 1; step <= 6; ++step) {
        CAPTURE(step);
        // Per rank and lookup: 5 bags over 12 ids drawn from [-1, 14) (ids 0..4 in early steps
        // only, so that their rows are evicted and reused), a fixed function of the arguments.
        const auto batch = [&](int r, int k) {
          std::vector<int64_t> ids;
          for (int i = 0; i < 12; ++i) {
            const int64_t v = (step * 7 + r * 5 + k * 3 + i * i) % 15 - 1;
            ids.push_back(step > 3 && v >= 0 && v < 5 ? v + 5 : v);
          }
          return longs(ids);
        };
        const at::Tensor offsets = longs({0, 1, 1, 4, 9});  // an empty bag too
        const at::Tensor w = at::randn({5, 3});
        std::vector<at::Tensor> out_host(world), out_tensors(world);
        for (int k = 0; k < 2; ++k) {
          const auto body = [&](std::vector<std::unique_ptr<EmbeddingTable>>& tables,
                                std::vector<at::Tensor>& outs) {
            return [&](int r) {
              outs[r] = train_lookup(*tables[r], batch(r, k), offsets, pooling, w);
            };
          };
          run_ranks(world, body(host, out_host));
          run_ranks(world, body(tensors, out_tensors));
          for (int r = 0; r < world; ++r) CHECK(at::equal(out_host[r], out_tensors[r]));
        }
        for (int r = 0; r < world; ++r) {
          CHECK(grads_of(*host[r]) == grads_of(*tensors[r]));
          update(*host[r]);
          update(*tensors[r]);
          end_step(*host[r], step);
          end_step(*tensors[r], step);
        }
      }
      for (int r = 0; r < world; ++r) {
        CHECK(host[r]->stats().evicted > 0);
        const Entries a = save(*host[r]), b = save(*tensors[r]);
        REQUIRE(a.size() == b.size());
        for (size_t k = 0; k < a.size(); ++k) {
          CAPTURE(a[k].first);
          CHECK(at::equal(a[k].second, b[k].second));
        }
        host[r]->set_training(false);
        tensors[r]->set_training(false);
      }
      const at::Tensor ids = longs({3, 7, -1, 12, 3, 100});
      std::vector<at::Tensor> eh(world), et(world);
      run_ranks(world, [&](int r) { eh[r] = host[r]->lookup(ids, longs({0, 2, 2}), pooling); });
      run_ranks(world, [&](int r) { et[r] = tensors[r]->lookup(ids, longs({0, 2, 2}), pooling); });
      for (int r = 0; r < world; ++r) CHECK(at::equal(eh[r], et[r]));
    }
  }
}
