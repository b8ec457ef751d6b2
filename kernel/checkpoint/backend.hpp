// What the checkpoint store needs of a backend: write the tensors of one object into a
// directory, and read them back. The store (store.hpp) runs the commit protocol around these
// two calls and knows nothing of plugins; the run implements it over a keel_checkpoint
// instance (run/checkpoint_backend.hpp).
#pragma once

#include <string>
#include <vector>

#include "keel/abi.h"

namespace keel {

class CheckpointBackend {
 public:
  virtual ~CheckpointBackend() = default;

  // Names the backend in errors ("[checkpoint] checkpoint 'safetensors' (plugin ...)").
  virtual const std::string& label() const = 0;
  // Writes `tensors` as object `stem` into directory `dir` (files only). Throws keel::Error.
  virtual void save(const std::string& dir, const std::string& stem,
                    const std::vector<keel_named_tensor>& tensors) const = 0;
  // Reads object `stem` of `dir` into `into` (same names, shapes and dtypes), in place.
  // Throws keel::Error.
  virtual void load(const std::string& dir, const std::string& stem,
                    const std::vector<keel_named_tensor>& into) const = 0;
};

}  // namespace keel
