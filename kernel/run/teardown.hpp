// A run's teardown: its parts released one by one in one stated order (teardown.cpp,
// kTeardown), each only while the parts it needs still exist. ~Run calls it, so the order does
// not depend on the order Run declares its members in.
#pragma once

#include <string>
#include <vector>

namespace keel {

struct Run;

// One part of a run: its name, how it is released, and the parts it needs until then (it
// borrows them, or its release uses them).
struct TeardownPart {
  const char* name;
  void (*release)(Run&);
  std::vector<const char*> needs;
};

// The run's parts in the order teardown releases them.
const std::vector<TeardownPart>& teardown_order();

// "" when every part of `order` is released before each part it needs and every part it needs
// is in `order`; else the first problem, naming both parts.
std::string check_teardown_order(const std::vector<TeardownPart>& order);

// Releases the run's parts in teardown_order(): the files the components hold are closed, the
// process group left, run.log detached and a scratch directory removed. The plugins stay loaded
// (the caller's Registry outlives the run). Called by ~Run.
void teardown(Run& run);

}  // namespace keel
