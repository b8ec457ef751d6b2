// Stand-in for a LibTorch header that Debian's libtorch-dev 1.13 does not ship
// (torch/csrc/distributed/autograd/ is missing from the package, but c10d/reducer.hpp includes
// it). reducer.hpp needs only two names from it: DistAutogradContext::GradCallback (in a
// static_assert) and ContextPtr (a std::shared_ptr member of c10d::Reducer). Both are declared
// here exactly as PyTorch 1.13 declares them, so c10d::Reducer has the layout the library was
// built with; nothing in keel creates or uses a DistAutogradContext. Only what compiles with
// the kernel's headers (kernel_inc, meson.build: the kernel, the tools, the tests that link the
// kernel) sees this directory, and only with -Dtorch=debian.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch {
namespace distributed {
namespace autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};
using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace autograd
}  // namespace distributed
}  // namespace torch
