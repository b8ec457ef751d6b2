// fashion_mnist on several ranks (keel_create_context rank / world_size), created through the
// registry as the kernel creates it: each rank reads order[rank::W] of the epoch's order padded
// or cut to a multiple of W, like torch.utils.data.DistributedSampler (compared with the real
// one from /usr/bin/python3), so W ranks with batch_size B see the batches of one rank with
// batch_size B * W. Samples are identified by their pixels among the split's first N images.
// With a limit, the dataset reads only the first `limit` samples: a train-images file damaged
// after them still gives the right ones, and a limit reaching into the damage fails.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "components.hpp"
#include "host.hpp"
#include "keel/tensor.hpp"
#include "options.hpp"
#include "loader/registry.hpp"
#include "support.hpp"

namespace unit_data_shards {  // keel_units is one unity build: each file's names stay its own

namespace {

using Indices = std::vector<int64_t>;

struct Shard {
  int rank = 0, world_size = 1;
  std::string split = "test", remainder = "auto";
  std::string path;  // empty: the option's default, the installed dataset
  int64_t limit = 96, batch_size = 4;
  bool shuffle = true, drop_last = false;
};

keel::Instance<keel_dataset> create(const Shard& s) {
  const keel::Component* c =
      keel_test::default_registry().find(KEEL_KIND_DATASET, "fashion_mnist");
  REQUIRE(c != nullptr);
  const std::string text = (s.path.empty() ? "" : "path = \"" + s.path + "\"\n") +
                           "split = \"" + s.split + "\"\nremainder = \"" + s.remainder +
                           "\"\nlimit = " + std::to_string(s.limit) +
                           "\nbatch_size = " + std::to_string(s.batch_size) +
                           "\nshuffle = " + (s.shuffle ? "true" : "false") +
                           "\ndrop_last = " + (s.drop_last ? "true" : "false") + "\n";
  const keel_options options = keel::validate_options(
      toml::parse(text), "data.train", "keel plugins show fashion_mnist", c->options);
  keel_create_context ctx{};
  ctx.host = keel::host();
  ctx.options = &options;
  ctx.section = "data.train";
  ctx.seed = 11;
  ctx.rank = s.rank;
  ctx.world_size = s.world_size;
  return keel::create_instance<keel_dataset>(*c, ctx);
}

std::string creation_error(const Shard& s) {
  return keel_test::error_of([&] { create(s); });
}

// The split's first `limit` images and labels, in file order.
struct Reference {
  at::Tensor images, labels;
};
const Reference& reference(const std::string& split, int64_t limit) {
  static std::map<std::pair<std::string, int64_t>, Reference> cache;
  Reference& r = cache[{split, limit}];
  if (r.images.defined()) return r;
  Shard all;
  all.split = split;
  all.limit = all.batch_size = limit;
  all.shuffle = false;
  const auto d = create(all);
  keel_batch b{};
  int has = 0;
  d.call("next", d->next, &b, &has);
  REQUIRE(has == 1);
  r.images = keel::adopt(b.inputs).reshape({limit, -1});
  r.labels = keel::adopt(b.targets);
  // Pixels identify a sample only if no two of these images are equal.
  const at::Tensor same = (r.images.unsqueeze(1) == r.images.unsqueeze(0)).all(2);
  REQUIRE(same.sum().item<int64_t>() == limit);
  return r;
}

// The dataset indices of a batch's samples (checking that its targets are their labels).
Indices indices_of(const Reference& ref, const at::Tensor& inputs, const at::Tensor& targets) {
  const at::Tensor rows = inputs.reshape({inputs.size(0), 1, -1});
  const at::Tensor match = (rows == ref.images.unsqueeze(0)).all(2);  // [batch, limit]
  REQUIRE(match.sum(1).eq(1).all().item<bool>());                     // each row found once
  const at::Tensor idx = match.to(at::kLong).argmax(1);
  CHECK(targets.equal(ref.labels.index_select(0, idx)));
  return Indices(idx.data_ptr<int64_t>(), idx.data_ptr<int64_t>() + idx.numel());
}

// Every batch from the dataset's current position to the end of the epoch.
std::vector<Indices> rest_of_epoch(const keel::Instance<keel_dataset>& d, const Shard& s) {
  const Reference& ref = reference(s.split, s.limit);
  std::vector<Indices> out;
  for (;;) {
    keel_batch b{};
    int has = 0;
    d.call("next", d->next, &b, &has);
    if (!has) return out;
    const at::Tensor inputs = keel::adopt(b.inputs), targets = keel::adopt(b.targets);
    CHECK(b.samples == inputs.size(0));
    out.push_back(indices_of(ref, inputs, targets));
  }
}

std::vector<Indices> epoch(const keel::Instance<keel_dataset>& d, const Shard& s, int64_t e) {
  d.call("start_epoch", d->start_epoch, e);
  return rest_of_epoch(d, s);
}

Indices flat(const std::vector<Indices>& batches) {
  Indices out;
  for (const Indices& b : batches) out.insert(out.end(), b.begin(), b.end());
  return out;
}

Indices iota(int64_t n) {
  Indices out(static_cast<size_t>(n));
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

// torch.utils.data.DistributedSampler(range(n), W, r, shuffle=False, drop_last) for each case,
// keyed "n W r drop_last", from Debian's python3-torch.
std::map<std::string, Indices> torch_samplers(const std::vector<std::array<int64_t, 3>>& cases) {
  std::string py = "from torch.utils.data import DistributedSampler as S\n";
  for (const auto& c : cases)
    py += "for r in range(" + std::to_string(c[1]) + "): print(" + std::to_string(c[0]) + ", " +
          std::to_string(c[1]) + ", r, " + std::to_string(c[2]) + ", *S(range(" +
          std::to_string(c[0]) + "), num_replicas=" + std::to_string(c[1]) +
          ", rank=r, shuffle=False, drop_last=" + (c[2] ? "True" : "False") + "))\n";
  keel_test::TempDir d;
  const auto script = d.write("samplers.py", py);
  std::FILE* p = popen(("/usr/bin/python3 " + script.string() + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string text;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) text += buf;
  REQUIRE_MESSAGE(pclose(p) == 0, "python3 with torch failed:\n" << text);
  std::map<std::string, Indices> out;
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::stringstream fields(line);
    int64_t n = 0, w = 0, r = 0, drop = 0, i = 0;
    fields >> n >> w >> r >> drop;
    Indices& got = out[std::to_string(n) + " " + std::to_string(w) + " " + std::to_string(r) +
                       " " + std::to_string(drop)];
    while (fields >> i) got.push_back(i);
  }
  return out;
}

// The first batch of a dataset that does not shuffle: [batch_size, 784] images and the labels.
std::pair<at::Tensor, at::Tensor> first_batch(Shard s) {
  s.shuffle = false;
  const auto d = create(s);
  keel_batch b{};
  int has = 0;
  d.call("next", d->next, &b, &has);
  REQUIRE(has == 1);
  return {keel::adopt(b.inputs).reshape({b.samples, -1}), keel::adopt(b.targets)};
}

// Fills `dir` with the installed Fashion-MNIST files (links) but a train-images file whose
// gzip stream holds the header and the first `intact` images whole (a full flush follows them)
// and then only the first 2000 bytes of the rest: a truncated gzip stream, damaged after
// image `intact` plus the few that 2000 compressed bytes hold.
void damaged_copy(const keel_test::fs::path& dir, int64_t intact) {
  keel_test::TempDir d;
  const auto script = d.write("damage.py", R"(import gzip, os, sys, zlib
src, dst, intact = "/usr/share/datasets/fashion-mnist", sys.argv[1], int(sys.argv[2])
for fn in os.listdir(src):
    if fn != "train-images-idx3-ubyte.gz":
        os.symlink(os.path.join(src, fn), os.path.join(dst, fn))
with gzip.open(os.path.join(src, "train-images-idx3-ubyte.gz"), "rb") as f:
    data = f.read()
cut = 16 + intact * 28 * 28
z = zlib.compressobj(6, zlib.DEFLATED, 31)
head = z.compress(data[:cut]) + z.flush(zlib.Z_FULL_FLUSH)
rest = z.compress(data[cut:]) + z.flush()
with open(os.path.join(dst, "train-images-idx3-ubyte.gz"), "wb") as f:
    f.write(head + rest[:2000])
)");
  const std::string cmd = "/usr/bin/python3 " + script.string() + " " + dir.string() + " " +
                          std::to_string(intact) + " 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string text;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) text += buf;
  REQUIRE_MESSAGE(pclose(p) == 0, "damage.py failed:\n" << text);
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("world_size 1: every remainder gives the order of a single process") {
  for (const std::string remainder : {"auto", "pad", "drop", "uneven"}) {
    CAPTURE(remainder);
    Shard s;
    s.limit = 90;
    s.batch_size = 32;
    s.remainder = remainder;
    const auto d = create(s);
    CHECK(d->size(d.self()) == 90);
    CHECK(d->batches_per_epoch(d.self()) == 3);
    const std::vector<Indices> batches = epoch(d, s, 1);
    REQUIRE(batches.size() == 3);
    CHECK(batches[2].size() == 26);
    // The epoch's order: randperm(N) of a generator seeded with seed + epoch * 1000003.
    const at::Tensor perm =
        at::randperm(90, at::make_generator<at::CPUGeneratorImpl>(11 + 1 * 1000003u), at::kLong);
    CHECK(flat(batches) == Indices(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + 90));
    s.shuffle = false;
    CHECK(flat(epoch(create(s), s, 1)) == iota(90));
  }
}

TEST_CASE("W ranks with batch_size B see the batches of one rank with batch_size B * W") {
  for (const std::string remainder : {"pad", "drop"}) {
    for (const int w : {2, 3, 4}) {
      CAPTURE(remainder);
      CAPTURE(w);
      Shard one;  // 96 samples: W * B divides N, so neither padding nor cutting changes anything
      one.remainder = remainder;
      one.batch_size = 4 * w;
      const auto single = create(one);
      std::vector<keel::Instance<keel_dataset>> ranks;
      std::vector<Shard> shards;
      for (int r = 0; r < w; ++r) {
        Shard s = one;
        s.rank = r;
        s.world_size = w;
        s.batch_size = 4;
        shards.push_back(s);
        ranks.push_back(create(s));
        CHECK(ranks.back()->size(ranks.back().self()) == 96 / w);
        CHECK(ranks.back()->batches_per_epoch(ranks.back().self()) == 96 / (4 * w));
      }
      Indices previous;
      for (int64_t e = 0; e < 2; ++e) {
        CAPTURE(e);
        const std::vector<Indices> big = epoch(single, one, e);
        const Indices order = flat(big);
        CHECK(order != iota(96));  // shuffled...
        CHECK(order != previous);  // ...differently each epoch
        previous = order;
        std::vector<std::vector<Indices>> small;
        for (int r = 0; r < w; ++r) small.push_back(epoch(ranks[r], shards[r], e));
        for (size_t t = 0; t < big.size(); ++t) {
          CAPTURE(t);
          Indices together;
          for (int r = 0; r < w; ++r) {
            REQUIRE(small[r].size() == big.size());
            together.insert(together.end(), small[r][t].begin(), small[r][t].end());
          }
          std::sort(together.begin(), together.end());
          Indices expected = big[t];
          std::sort(expected.begin(), expected.end());
          CHECK(together == expected);
        }
        // DistributedSampler's layout: rank r's j-th sample is order[j * W + r].
        for (int r = 0; r < w; ++r) {
          const Indices mine = flat(small[r]);
          for (size_t j = 0; j < mine.size(); ++j) CHECK(mine[j] == order[j * w + r]);
        }
      }
    }
  }
}

TEST_CASE("remainder pad and drop give torch's DistributedSampler(shuffle=False) order") {
  // {n, W, drop_last}: padding by less than n, by more than n (n < W), nothing to pad or cut.
  const std::vector<std::array<int64_t, 3>> cases = {
      {10, 4, 0}, {10, 4, 1}, {13, 3, 0}, {13, 3, 1}, {3, 4, 0}, {12, 4, 0}, {12, 4, 1}};
  const std::map<std::string, Indices> torch = torch_samplers(cases);
  for (const auto& c : cases) {
    for (int r = 0; r < c[1]; ++r) {
      Shard s;
      s.limit = c[0];
      s.world_size = static_cast<int>(c[1]);
      s.rank = r;
      s.remainder = c[2] ? "drop" : "pad";
      s.batch_size = 2;
      s.shuffle = false;
      const std::string key = std::to_string(c[0]) + " " + std::to_string(c[1]) + " " +
                              std::to_string(r) + " " + std::to_string(c[2]);
      CAPTURE(key);
      REQUIRE(torch.count(key) == 1);
      const Indices expected = torch.at(key);
      const auto d = create(s);
      CHECK(d->size(d.self()) == static_cast<int64_t>(expected.size()));
      CHECK(flat(epoch(d, s, 0)) == expected);
    }
  }
}

TEST_CASE("remainder on 10 samples and 4 ranks: pad repeats the order's first, drop cuts its "
          "last, uneven and auto") {
  Shard one;
  one.limit = 10;
  one.batch_size = 1;
  const Indices order = flat(epoch(create(one), one, 3));
  REQUIRE(order.size() == 10);
  Indices padded = order;
  padded.push_back(order[0]);
  padded.push_back(order[1]);
  const std::map<std::string, std::pair<Indices, std::vector<int64_t>>> modes = {
      {"pad", {padded, {3, 3, 3, 3}}},
      {"drop", {Indices(order.begin(), order.begin() + 8), {2, 2, 2, 2}}},
      {"uneven", {order, {3, 3, 2, 2}}}};
  for (const auto& case_ : modes) {
    // (Not a structured binding: clang rejects one captured by a lambda, CAPTURE's
    // included, before C++20.)
    const auto& mode = case_.first;
    const auto& expected = case_.second;
    for (int r = 0; r < 4; ++r) {
      CAPTURE(mode);
      CAPTURE(r);
      Shard s = one;
      s.remainder = mode;
      s.rank = r;
      s.world_size = 4;
      s.batch_size = 2;
      const auto d = create(s);
      const int64_t size = expected.second[r];
      CHECK(d->size(d.self()) == size);
      CHECK(d->batches_per_epoch(d.self()) == (size + 1) / 2);
      const std::vector<Indices> batches = epoch(d, s, 3);
      REQUIRE(batches.size() == static_cast<size_t>((size + 1) / 2));
      CHECK(batches.back().size() == (size % 2 ? 1u : 2u));  // the shard's last batch
      const Indices mine = flat(batches);
      REQUIRE(mine.size() == static_cast<size_t>(size));
      for (size_t j = 0; j < mine.size(); ++j) CHECK(mine[j] == expected.first[j * 4 + r]);
      // drop_last drops the shard's incomplete last batch.
      s.drop_last = true;
      const auto dropping = create(s);
      CHECK(dropping->batches_per_epoch(dropping.self()) == size / 2);
      CHECK(epoch(dropping, s, 3).size() == static_cast<size_t>(size / 2));
    }
  }
  // auto: pad for split train, uneven for split test (rank 3 of 4: 3 samples padded, else 2).
  Shard s = one;
  s.rank = 3;
  s.world_size = 4;
  s.split = "train";
  const auto train = create(s);
  CHECK(train->size(train.self()) == 3);
  s.split = "test";
  const auto test = create(s);
  CHECK(test->size(test.self()) == 2);
}

TEST_CASE("seek(epoch, batch) on a rank continues like start_epoch and `batch` calls of next") {
  Shard s;
  s.limit = 50;
  s.rank = 1;
  s.world_size = 3;
  s.remainder = "pad";
  const auto d = create(s);
  const std::vector<Indices> whole = epoch(d, s, 2);
  REQUIRE(whole.size() == 5);  // 17 samples: 4 + 4 + 4 + 4 + 1
  for (int64_t b = 0; b <= 5; ++b) {
    CAPTURE(b);
    const auto fresh = create(s);
    fresh.call("seek", fresh->seek, int64_t{2}, b);
    CHECK(rest_of_epoch(fresh, s) == std::vector<Indices>(whole.begin() + b, whole.end()));
  }
}

TEST_CASE("a shard too small for one batch fails at creation naming the rank, with a hint") {
  Shard s;
  s.limit = 3;
  s.world_size = 4;
  s.remainder = "drop";
  CHECK(contains(creation_error(s),
                 "[data.train] dataset 'fashion_mnist' (plugin keel-fashion-mnist): creation "
                 "failed: fashion_mnist: split 'test' has 3 samples; rank 0 of world_size 4 gets "
                 "0 of them (remainder = \"drop\"), so an epoch has no batch on that rank; hint: "
                 "use at least 4 samples (raise limit) or set remainder = \"pad\""));
  s.remainder = "auto";  // uneven for test: ranks 0..2 get one sample each, rank 3 none
  s.rank = 2;
  CHECK(creation_error(s) == "<no error>");
  s.rank = 3;
  CHECK(contains(creation_error(s),
                 "rank 3 of world_size 4 gets 0 of them (remainder = \"uneven\"), so an epoch has "
                 "no batch on that rank; hint:"));
  s.limit = 10;
  s.rank = 1;
  s.remainder = "pad";
  s.drop_last = true;
  CHECK(contains(creation_error(s),
                 "fashion_mnist: split 'test' has 10 samples; rank 1 of world_size 4 gets 3 of "
                 "them (remainder = \"pad\"), fewer than batch_size 4 with drop_last = true, so "
                 "an epoch has no batch on that rank; hint: lower batch_size, raise limit or set "
                 "drop_last = false"));
  s.world_size = 1;
  s.rank = 0;
  s.limit = 3;
  CHECK(contains(creation_error(s),
                 "creation failed: fashion_mnist: split 'test' has 3 samples, fewer than "
                 "batch_size 4 with drop_last = true, so an epoch has no batch; hint: lower "
                 "batch_size, raise limit or set drop_last = false"));
  s.world_size = 2;
  s.rank = 2;
  CHECK(contains(creation_error(s), "fashion_mnist: rank 2 of world_size 2 is out of range"));
}

TEST_CASE("limit reads only the first samples: damage after them goes unnoticed, damage within "
          "them fails as a whole read does") {
  // The first 512 samples of a whole read of the installed train split (limit 0: every sample).
  Shard whole;
  whole.split = "train";
  whole.limit = 0;
  whole.batch_size = 512;
  const auto [images, labels] = first_batch(whole);
  REQUIRE(images.size(0) == 512);

  keel_test::TempDir d;
  damaged_copy(d.path, 512);
  const std::string file = (d.path / "train-images-idx3-ubyte.gz").string();
  for (const int64_t limit : {256, 512}) {
    CAPTURE(limit);
    Shard s;
    s.split = "train";
    s.limit = s.batch_size = limit;
    const auto [got_images, got_labels] = first_batch(s);  // the installed files
    CHECK(got_images.equal(images.slice(0, 0, limit)));
    CHECK(got_labels.equal(labels.slice(0, 0, limit)));
    s.path = d.path.string();  // the damaged copy: its first 512 images are intact
    const auto [damaged_images, damaged_labels] = first_batch(s);
    CHECK(damaged_images.equal(images.slice(0, 0, limit)));
    CHECK(damaged_labels.equal(labels.slice(0, 0, limit)));
  }
  // A limit reaching into the damage, and a whole read, fail as before limit read less.
  for (const int64_t limit : {1024, 0}) {
    CAPTURE(limit);
    Shard s;
    s.split = "train";
    s.path = d.path.string();
    s.limit = limit;
    CHECK(contains(creation_error(s),
                   "creation failed: fashion_mnist: " + file +
                       ": corrupt or truncated gzip data (unexpected end of file); hint: install "
                       "dataset-fashion-mnist or set [data.train] path to the directory holding "
                       "the *-ubyte.gz files"));
  }
}

}  // namespace unit_data_shards
