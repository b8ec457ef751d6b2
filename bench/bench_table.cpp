// bench_table: rows per second of keel::EmbeddingTable (libkeel-embedding) against a raw
// absl::flat_hash_map<int64_t, int64_t> alone doing the same id -> index work, in one process.
//
// --ids distinct random ids >= 0 (a fixed seed) are fed in batches of --batch ids:
//   insert  new ids: a fresh table looks every batch up in training (one id a bag, sum pooling,
//           gradients off: the forward alone), which admits each id (min_count 1) and creates
//           its row (dim floats drawn from (seed, name, id)); the map: try_emplace(id, next
//           index) for every id of a fresh map
//   lookup  existing ids: the filled table looks the batches up again, in a shuffled order,
//           in training (counts the sighting, moves the row in the eviction order, copies the
//           row into the output); the map: find(id) for every id, summing the indices
// Both run on one thread (LibTorch's intra-op threads set to 1). Each round times the four in a
// rotating order. Per round: rows/s of each and the ratios table time / map time (the table's
// overhead over the raw map: 1.0 = none), and the CPU other processes used meanwhile (the
// machine is shared: rounds with more than 0.10 other cores are marked busy). The summary gives
// min and median time over rounds as rows/s, and the median of the per-round ratios.
//
// Usage: bench_table [--rounds R] [--ids N] [--batch B] [--dim D]
//   defaults: 5 rounds, 1000000 ids, batches of 65536, dim 16
#include <absl/container/flat_hash_map.h>

#include <ATen/Parallel.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "keel/embedding.hpp"
#include "machine_load.hpp"

namespace {

struct Args {
  int rounds = 5;
  int64_t ids = 1000000;
  int64_t batch = 65536;
  int64_t dim = 16;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_table: %s needs a value\n", k.c_str());
      std::exit(2);
    }
    const long long v = std::atoll(argv[++i]);
    if (k == "--rounds") a.rounds = static_cast<int>(v);
    else if (k == "--ids") a.ids = v;
    else if (k == "--batch") a.batch = v;
    else if (k == "--dim") a.dim = v;
    else {
      std::fprintf(stderr, "bench_table: unknown option %s; hint: --rounds --ids --batch --dim\n",
                   k.c_str());
      std::exit(2);
    }
  }
  if (a.rounds < 1 || a.ids < 1 || a.batch < 1 || a.dim < 1) {
    std::fprintf(stderr, "bench_table: every option must be >= 1\n");
    std::exit(2);
  }
  return a;
}

double seconds(const std::function<void()>& body) {
  const auto t0 = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Data {
  std::vector<int64_t> ids;       // insertion order
  std::vector<int64_t> shuffled;  // lookup order
  at::Tensor offsets;             // one id a bag, for a full batch
};

Data make_data(const Args& a) {
  Data d;
  std::mt19937_64 gen(12345);
  absl::flat_hash_map<int64_t, bool> seen;
  while (static_cast<int64_t>(d.ids.size()) < a.ids) {
    const int64_t id = static_cast<int64_t>(gen() >> 1);
    if (seen.emplace(id, true).second) d.ids.push_back(id);
  }
  d.shuffled = d.ids;
  std::shuffle(d.shuffled.begin(), d.shuffled.end(), gen);
  d.offsets = at::arange(a.batch, at::kLong);
  return d;
}

// The table looks up every batch of `ids` (training, gradients off).
void table_pass(keel::EmbeddingTable& t, const std::vector<int64_t>& ids, const Data& d,
                int64_t batch) {
  for (size_t at = 0; at < ids.size(); at += static_cast<size_t>(batch)) {
    const int64_t n = std::min<int64_t>(batch, static_cast<int64_t>(ids.size() - at));
    const at::Tensor chunk =
        at::from_blob(const_cast<int64_t*>(ids.data() + at), {n}, at::kLong);
    const at::Tensor out = t.lookup(chunk, d.offsets.narrow(0, 0, n), keel::Pooling::kSum);
    if (out.size(0) != n) std::abort();
  }
}

keel::TableOptions table_options(const Args& a) {
  keel::TableOptions o;
  o.name = "bench";
  o.dim = a.dim;
  o.seed = 1;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  at::set_num_threads(1);
  c10::NoGradGuard no_grad;
  const Data d = make_data(a);
  std::printf("bench_table: %lld ids, batches of %lld, dim %lld, %d rounds, 1 thread\n",
              static_cast<long long>(a.ids), static_cast<long long>(a.batch),
              static_cast<long long>(a.dim), a.rounds);
  std::vector<double> t_ins, m_ins, t_look, m_look, r_ins, r_look;
  volatile int64_t sink = 0;
  for (int round = 0; round < a.rounds; ++round) {
    keel_bench::OtherLoad load;
    auto table = std::make_unique<keel::EmbeddingTable>(table_options(a), nullptr);
    absl::flat_hash_map<int64_t, int64_t> map;
    double ti = 0, mi = 0, tl = 0, ml = 0;
    // Rotating order: inserts before their lookups, the table's and the map's pairs swapped.
    auto table_pair = [&] {
      ti = seconds([&] { table_pass(*table, d.ids, d, a.batch); });
      tl = seconds([&] { table_pass(*table, d.shuffled, d, a.batch); });
    };
    auto map_pair = [&] {
      mi = seconds([&] {
        int64_t next = 0;
        for (int64_t id : d.ids) map.try_emplace(id, next++);
      });
      ml = seconds([&] {
        int64_t s = 0;
        for (int64_t id : d.shuffled) {
          auto it = map.find(id);
          s += it == map.end() ? -1 : it->second;
        }
        sink = sink + s;
      });
    };
    if (round % 2 == 0) {
      table_pair();
      map_pair();
    } else {
      map_pair();
      table_pair();
    }
    if (table->stats().rows != a.ids || static_cast<int64_t>(map.size()) != a.ids) std::abort();
    const double other = load.cores();
    t_ins.push_back(ti), m_ins.push_back(mi), t_look.push_back(tl), m_look.push_back(ml);
    r_ins.push_back(ti / mi), r_look.push_back(tl / ml);
    const double n = static_cast<double>(a.ids);
    std::printf("round %d: insert table %.3g rows/s, map %.3g rows/s (x%.2f); lookup table "
                "%.3g rows/s, map %.3g rows/s (x%.2f); other processes %.2f cores%s\n",
                round + 1, n / ti, n / mi, ti / mi, n / tl, n / ml, tl / ml, other,
                other > 0.10 ? " (busy)" : "");
  }
  const double n = static_cast<double>(a.ids);
  auto summary = [&](const char* what, const std::vector<double>& t, const std::vector<double>& m,
                     const std::vector<double>& r) {
    std::printf("%s: table rows/s best %.3g median %.3g; map rows/s best %.3g median %.3g; "
                "table/map time: median x%.2f (min x%.2f, max x%.2f) over %zu rounds\n",
                what, n / *std::min_element(t.begin(), t.end()), n / median(t),
                n / *std::min_element(m.begin(), m.end()), n / median(m), median(r),
                *std::min_element(r.begin(), r.end()), *std::max_element(r.begin(), r.end()),
                r.size());
  };
  summary("insert", t_ins, m_ins, r_ins);
  summary("lookup", t_look, m_look, r_look);
  return 0;
}
