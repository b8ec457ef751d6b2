// The host's side of the extensions' named tensors (sdk/include/keel/ext/tensors.h): a set of
// tensors lent to a plugin for one call, and a writer a plugin puts tensors into.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "keel/ext/tensors.h"
#include "keel/tensor.hpp"

namespace keel {

// Tensors by name, in the order given (keel::find and keel::names_of, keel/tensor.hpp).
using Named = NamedTensors;

// A keel_tensor_set over `named` (which must outlive it), and how many references each tensor
// and its storage had when it was made, to tell afterwards whether a plugin kept one.
class LentSet {
 public:
  explicit LentSet(const Named& named);
  LentSet(const LentSet&) = delete;
  LentSet& operator=(const LentSet&) = delete;
  const keel_tensor_set* abi() const { return view_.abi(); }
  // "" or the name of a tensor that is referenced more (or less) than when lent.
  std::string kept() const;

 private:
  static std::pair<size_t, size_t> count(const at::Tensor& t);
  const Named& named_;
  std::vector<std::pair<size_t, size_t>> refs_;  // each tensor's reference counts when lent
  TensorSetView view_;
};

// A keel_tensor_writer for one call: collects what the plugin puts, in order, and remembers the
// first refusal (a NULL tensor, an empty or over-long name, a name put twice, too many).
struct TensorWriter {
  TensorWriter();
  TensorWriter(const TensorWriter&) = delete;
  TensorWriter& operator=(const TensorWriter&) = delete;

  keel_tensor_writer abi{};
  Named tensors;
  std::string refusal;  // "" when every put was kept

 private:
  static int put(keel_tensor_writer* w, const char* name, keel_tensor* tensor) noexcept;
};

}  // namespace keel
