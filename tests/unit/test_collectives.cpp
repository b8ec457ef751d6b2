// Reduce-scatter, all-gather and exchange (kernel/distributed/collectives.hpp) on Gloo, with 2
// and 3 ranks: forked processes, each with a keel::ProcessGroup over a TCPStore on a free local
// port. Each rank computes every rank's inputs from a seed, so it checks its own results
// exactly (bitwise) against a reference computed element by element in rank order:
// - reduce-scatter of chunks of uneven sizes (3, 0, 10, 1 elements), divided by W, and
//   accumulated into existing values;
// - all-gather into views of one padded buffer (a 7-row parameter's dim-0 chunks of
//   ceil(7 / W) rows, as FSDP2 lays them out), beside a small tensor and an empty one;
// - a reduce-scatter and an all-gather outstanding together, waited in reverse order;
// - exchange: every rank's values, by rank;
// - ProcessGroup::sum_async with a blocking max issued while it is in flight; the group's
//   collective count;
// - a peer that exits: the survivor's wait() throws keel::Error naming the operation and
//   the rank, within the 5 s timeout.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "distributed/collectives.hpp"
#include "distributed/process_group.hpp"
#include "error.hpp"

namespace unit_collectives {  // keel_units is one unity build: each file's names stay its own

namespace {

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// What a rank found wrong (written to stderr; the rank's exit status says whether any).
struct Failures {
  int count = 0;
  void expect(bool ok, const std::string& what) {
    if (ok) return;
    ++count;
    std::fprintf(stderr, "collectives test: %s\n", what.c_str());
  }
};

// Runs `body` in `world` forked ranks of one process group (timeout 5 s); the exit status of
// each rank (0: no failure), by rank. A rank still running after 60 s is killed (status -1).
std::vector<int> run_ranks(int world,
                           const std::function<void(keel::ProcessGroup&, int, Failures&)>& body) {
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int status = 0;
      try {
        keel::Launch l;
        l.launcher = "test";
        l.rank = r;
        l.world_size = world;
        l.master_addr = "127.0.0.1";
        l.master_port = port;
        keel::DistributedOptions o;
        o.timeout = std::chrono::seconds(5);
        o.backend = "gloo";
        keel::ProcessGroup group(l, o, at::Device(at::kCPU));
        Failures f;
        body(group, r, f);
        status = f.count == 0 ? 0 : 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "collectives test: rank %d: %s\n", r, e.what());
        status = 2;
      }
      std::fflush(stderr);
      _exit(status);
    }
    pids.push_back(pid);
  }
  std::vector<int> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (pid_t pid : pids) {
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        st = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    out.push_back(st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }
  return out;
}

// Rank q's packed reduce-scatter input: W blocks (one per destination) of C floats.
at::Tensor packed_of(int q, int world, int64_t chunk, int seed) {
  at::manual_seed(static_cast<uint64_t>(seed * 100 + q));
  return at::randn({world * chunk});
}

const std::vector<std::vector<int64_t>> kShapes = {{3}, {0, 2}, {2, 5}, {1, 1}};

std::vector<at::Tensor> outputs_like(const std::vector<std::vector<int64_t>>& shapes,
                                     float fill) {
  std::vector<at::Tensor> out;
  for (const auto& s : shapes) out.push_back(at::full(s, fill));
  return out;
}

// The reference: element e of this rank's chunk, summed over ranks 0..W-1 in that order, then
// divided (and added to `base` when accumulating), one float at a time.
void check_reduce_scatter(Failures& f, const std::vector<at::Tensor>& out, int rank, int world,
                          int seed, float divide_by, bool accumulate, float base,
                          const std::string& what) {
  int64_t chunk = 0;
  for (const at::Tensor& o : out) chunk += o.numel();
  std::vector<at::Tensor> inputs;
  for (int q = 0; q < world; ++q) inputs.push_back(packed_of(q, world, chunk, seed));
  int64_t e = 0;
  for (size_t k = 0; k < out.size(); ++k) {
    const at::Tensor flat = out[k].reshape({-1});
    for (int64_t i = 0; i < flat.numel(); ++i, ++e) {
      float sum = inputs[0].data_ptr<float>()[rank * chunk + e];
      for (int q = 1; q < world; ++q) sum += inputs[q].data_ptr<float>()[rank * chunk + e];
      if (divide_by != 1.0f) sum /= divide_by;
      if (accumulate) sum = base + sum;
      const float got = flat.data_ptr<float>()[i];
      f.expect(got == sum, what + ": rank " + std::to_string(rank) + " output " +
                               std::to_string(k) + "[" + std::to_string(i) + "] = " +
                               std::to_string(got) + ", expected " + std::to_string(sum));
    }
  }
}

// All-gather of a 7x2 parameter's dim-0 chunks (ceil(7/W) rows each, padded) into its own
// padded buffer, beside a 3-element tensor and an empty one. Rank q's values: q * 100 + i.
struct Gather {
  int64_t rows_per_rank = 0;
  at::Tensor padded;                        // [rows_per_rank * W, 2]
  std::vector<at::Tensor> small;            // per rank, [3]
  keel::Pending pending;

  Gather(keel::Collectives& c, int rank, int world) {
    rows_per_rank = (7 + world - 1) / world;
    padded = at::full({rows_per_rank * world, 2}, -1.0f);
    padded.narrow(0, rank * rows_per_rank, rows_per_rank)
        .copy_(at::arange(rows_per_rank * 2, at::kFloat).view({rows_per_rank, 2}) + rank * 100);
    const at::Tensor mine = at::arange(3, at::kFloat) + rank * 100 + 50;
    std::vector<std::vector<at::Tensor>> outputs;
    for (int q = 0; q < world; ++q) {
      small.push_back(at::zeros({3}));
      outputs.push_back({padded.narrow(0, q * rows_per_rank, rows_per_rank), small.back(),
                         at::empty({0})});
    }
    pending = c.all_gather({padded.narrow(0, rank * rows_per_rank, rows_per_rank), mine,
                            at::empty({0})},
                           std::move(outputs), "test all-gather");
  }

  void check(Failures& f, int world) const {
    for (int q = 0; q < world; ++q) {
      for (int64_t i = 0; i < rows_per_rank * 2; ++i) {
        const float got = padded.narrow(0, q * rows_per_rank, rows_per_rank)
                              .reshape({-1}).data_ptr<float>()[i];
        f.expect(got == static_cast<float>(q * 100 + i),
                 "all-gather: rank " + std::to_string(q) + "'s row element " + std::to_string(i) +
                     " = " + std::to_string(got));
      }
      for (int64_t i = 0; i < 3; ++i)
        f.expect(small[q].data_ptr<float>()[i] == static_cast<float>(q * 100 + 50 + i),
                 "all-gather: rank " + std::to_string(q) + "'s small tensor");
    }
  }
};

void collectives_body(keel::ProcessGroup& group, int rank, Failures& f) {
  keel::Collectives& c = group.collectives();
  const int world = c.world();
  f.expect(c.rank() == rank, "rank()");
  const int64_t issued_before = group.collectives_issued();
  int64_t chunk = 0;
  for (const auto& s : kShapes) chunk += at::empty(s).numel();  // 3 + 0 + 10 + 1

  // Divided by W, into fresh outputs.
  std::vector<at::Tensor> out = outputs_like(kShapes, 7.0f);
  keel::Pending p = c.reduce_scatter(packed_of(rank, world, chunk, 1), out,
                                     static_cast<double>(world), false, "test reduce-scatter");
  f.expect(p.active(), "a reduce-scatter in flight is active");
  p.wait();
  p.wait();  // idempotent
  f.expect(!p.active(), "a waited reduce-scatter is not active");
  check_reduce_scatter(f, out, rank, world, 1, static_cast<float>(world), false, 0, "divided");

  // Accumulated into 0.5, not divided.
  std::vector<at::Tensor> acc = outputs_like(kShapes, 0.5f);
  c.reduce_scatter(packed_of(rank, world, chunk, 2), acc, 1.0, true, "test reduce-scatter").wait();
  check_reduce_scatter(f, acc, rank, world, 2, 1.0f, true, 0.5f, "accumulated");

  // Nothing to move: no collective, and wait() is fine.
  c.reduce_scatter(at::empty({0}), {at::empty({0})}, 1.0, false, "test empty").wait();

  // Two outstanding, waited in reverse order.
  std::vector<at::Tensor> out3 = outputs_like(kShapes, 0.0f);
  keel::Pending rs = c.reduce_scatter(packed_of(rank, world, chunk, 3), out3, 1.0, false,
                                      "test reduce-scatter");
  Gather g(c, rank, world);
  g.pending.wait();
  rs.wait();
  g.check(f, world);
  check_reduce_scatter(f, out3, rank, world, 3, 1.0f, false, 0, "outstanding");

  const std::vector<std::vector<double>> x =
      c.exchange({static_cast<double>(rank), rank * 2.5, -1e300 * rank}, "test exchange");
  f.expect(x.size() == static_cast<size_t>(world), "exchange: one row per rank");
  for (int q = 0; q < world && q < static_cast<int>(x.size()); ++q)
    f.expect(x[q] == std::vector<double>{static_cast<double>(q), q * 2.5, -1e300 * q},
             "exchange: rank " + std::to_string(q) + "'s values");
  f.expect(c.exchange({}, "test exchange").size() == static_cast<size_t>(world),
           "exchange of nothing: one empty row per rank");
  // A sum in flight while a blocking max runs (as a step's outcome agreement is while backward
  // all-reduces the gradients), waited for after it.
  keel::PendingSum sum = group.sum_async({rank + 1.0, 0.25, -2.0 * rank}, "test sum_async");
  f.expect(sum.issued(), "sum_async: issued");
  const std::vector<double> most = group.max({static_cast<double>(rank)}, "test max");
  const std::vector<double> total = sum.wait();
  f.expect(!sum.issued(), "sum_async: waited");
  f.expect(most == std::vector<double>{world - 1.0}, "max beside a pending sum");
  f.expect(total == std::vector<double>{world * (world + 1) / 2.0, 0.25 * world,
                                        -1.0 * world * (world - 1)},
           "sum_async: the sums over ranks");
  f.expect(group.sum_async({}, "test empty sum").wait().empty(), "sum_async of nothing");
  // 3 reduce-scatters that moved data, 1 all-gather, 1 exchange (the empty ones move nothing),
  // the pending sum and the max.
  f.expect(group.collectives_issued() - issued_before == 7,
           "collectives issued: " + std::to_string(group.collectives_issued() - issued_before));
}

}  // namespace

TEST_CASE("reduce-scatter, all-gather and exchange with 2 and 3 ranks, exact") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    const std::vector<int> status = run_ranks(world, collectives_body);
    CHECK(status == std::vector<int>(static_cast<size_t>(world), 0));
  }
}

TEST_CASE("a peer that exits: wait() throws keel::Error naming the operation and the rank") {
  const std::vector<int> status = run_ranks(2, [](keel::ProcessGroup& group, int rank,
                                                  Failures& f) {
    if (rank == 1) return;  // exits without taking part
    keel::Collectives& c = group.collectives();
    std::vector<at::Tensor> out{at::zeros({4})};
    const auto t0 = std::chrono::steady_clock::now();
    std::string error;
    try {
      c.reduce_scatter(at::ones({8}), out, 1.0, false, "test lost peer").wait();
    } catch (const keel::Error& e) {
      error = e.what();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    f.expect(error.rfind("distributed: test lost peer failed on rank 0 of 2 (", 0) == 0,
             "error: '" + error + "'");
    f.expect(s < 7.0, "the error came after " + std::to_string(s) + " s");
  });
  CHECK(status == std::vector<int>{0, 0});
}

}  // namespace unit_collectives
