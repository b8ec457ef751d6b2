// libFuzzer target: trainer_state.toml of a checkpoint (kernel/checkpoint/meta.cpp).
//
// Input: the file's text. keel::Error is the expected refusal; anything else escaping, a
// message that is not one line starting with "trainer_state.toml:<line>:<col>: ", or accepted
// metadata that does not survive write_checkpoint_meta -> read_checkpoint_meta aborts. Inputs
// that hit a known toml++ bug (toml_known_bugs.hpp) are skipped.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "checkpoint/meta.hpp"
#include "error.hpp"
#include "toml_known_bugs.hpp"

namespace {

const std::string kPath = "trainer_state.toml";

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_checkpoint_meta: %s: %s\n", what, detail.c_str());
  std::abort();
}

// "<digits>:" at `i`, moving past it.
bool number_then_colon(const std::string& s, size_t& i) {
  const size_t start = i;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  return i > start && i < s.size() && s[i++] == ':';
}

void check_message(const std::string& msg) {
  static const std::string kWhat = " invalid checkpoint metadata: ";
  size_t i = kPath.size() + 1;
  const bool ok = msg.rfind(kPath + ":", 0) == 0 && number_then_colon(msg, i) &&
                  number_then_colon(msg, i) &&
                  msg.compare(i, kWhat.size(), kWhat) == 0 &&
                  msg.find('\n') == std::string::npos;
  if (!ok) die("message is not one line naming file:line:col", msg);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (keel_fuzz::hits_toml_whitespace_bug(text)) return 0;
  keel::CheckpointMeta m;
  try {
    m = keel::read_checkpoint_meta(text, kPath);
  } catch (const keel::Error& e) {
    check_message(e.what());
    return 0;
  }
  if (m.step < 0 || m.epoch < 0 || m.epoch_batches < 0 || m.samples < 0 || m.tokens < 0 ||
      m.skipped_steps < 0 || m.last_eval_step < -1)
    die("negative count accepted", text);
  const std::string written = keel::write_checkpoint_meta(m);
  keel::CheckpointMeta again;
  try {
    again = keel::read_checkpoint_meta(written, kPath);
  } catch (const keel::Error& e) {
    die("written metadata does not read back", std::string(e.what()) + "\n" + written);
  }
  if (!(again == m)) die("round trip changed the metadata", written);
  return 0;
}
