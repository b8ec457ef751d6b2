// trainer_state.toml, the kernel's metadata file in every committed checkpoint directory:
//
//   step = 32          # optimizer steps taken
//   epoch = 3          # the epoch (0-based) it was saved in
//   samples = 1024
//   tokens = 1024
//   objects = ["model", "hooks"]   # the files the backend wrote (<stem>.<ext>)
//
// Reading and writing it needs no LibTorch (tests/fuzz/fuzz_checkpoint_meta.cpp uses it alone).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace keel {

struct CheckpointMeta {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t samples = 0;
  int64_t tokens = 0;
  std::vector<std::string> objects = {};  // "model", and "hooks" when hooks keep state
};

// Parses the text of a trainer_state.toml; `path` names it in messages. step, epoch, samples
// and tokens must be integers >= 0 and objects a list of strings, all present, nothing else.
// Throws keel::Error "path:line:col: invalid checkpoint metadata: <what>" on anything wrong.
CheckpointMeta read_checkpoint_meta(std::string_view text, const std::string& path);

// The text of trainer_state.toml for `meta` (read_checkpoint_meta reads it back unchanged).
std::string write_checkpoint_meta(const CheckpointMeta& meta);

}  // namespace keel
