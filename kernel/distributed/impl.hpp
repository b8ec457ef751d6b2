// ProcessGroup's c10d state, shared by the sources of this folder only (it includes c10d).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <c10/util/Exception.h>

#include "distributed/process_group.hpp"
#include "error.hpp"

namespace keel {

struct ProcessGroup::Impl {
  Launch launch;
  std::chrono::seconds timeout{0};
  std::string backend;
  at::Device comm{at::kCPU};  // where collectives' tensors live (CUDA for NCCL)
  c10::intrusive_ptr<c10d::Store> store;
  std::string store_prefix;  // keel's key prefix in the job's TCPStore (store wraps it)
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  int64_t shared = 0;  // share() calls so far: each gets its own store key
  int64_t issued = 0;  // collectives issued so far (all kinds): ProcessGroup::collectives_issued

  // keel::Error for a failed collective `what`, with the engine's first line `why`.
  Error failure(const std::string& what, const std::string& why) const;

  // Runs `body`, turning an engine exception into failure(what, ...).
  template <class F>
  void guarded(const std::string& what, F&& body) const {
    try {
      body();
    } catch (const Error&) {
      throw;
    } catch (const c10::Error& e) {
      throw failure(what, e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw failure(what, e.what());
    }
  }

  // An all-reduce of a few doubles: start() issues it (values on the collectives' device),
  // finish() waits and reads the result back; reduce() does both.
  struct Reduction {
    size_t size = 0;
    at::Tensor values;
    c10::intrusive_ptr<c10d::Work> work;
  };
  Reduction start(const std::vector<double>& values, c10d::ReduceOp op, const std::string& what);
  std::vector<double> finish(const Reduction& r, const std::string& what);
  std::vector<double> reduce(std::vector<double> values, c10d::ReduceOp op,
                             const std::string& what);
};

}  // namespace keel
