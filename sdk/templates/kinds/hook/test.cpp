#include <string>
#include <vector>

// Sends `kind` once per loss (trainer state: step 1, 2, ... with that loss) and returns the
// requests the hook set each time.
std::vector<uint32_t> send(const keel::testing::Instance<keel_hook>& hook, keel_event_kind kind,
                           const std::vector<double>& losses) {
  std::vector<uint32_t> requests;
  for (size_t i = 0; i < losses.size(); ++i) {
    keel_trainer_state state{};
    state.struct_size = sizeof state;
    state.step = static_cast<int64_t>(i) + 1;
    state.loss = losses[i];
    keel_event event{};
    event.struct_size = sizeof event;
    event.kind = kind;
    event.state = &state;
    if (kind == KEEL_EVENT_METRICS) event.split = "train";
    hook.call(hook->on_event, &event);
    requests.push_back(event.requests);
  }
  return requests;
}

TEST_CASE("@{component}: a STEP_END with a loss below target_loss requests a stop") {
  keel::testing::clear_log_lines();
  auto hook = keel::testing::Plugin(keel_plugin_entry())
                  .create<keel_hook>("@{component}", {{"target_loss", 0.5}});
  CHECK(send(hook, KEEL_EVENT_STEP_END, {1.0, 0.7, 0.5, 0.4}) ==
        std::vector<uint32_t>{0, 0, 0, KEEL_REQUEST_STOP});
  const std::vector<std::string> lines = keel::testing::log_lines();
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("step 4: loss 0.4") != std::string::npos);
}

TEST_CASE("@{component}: other events never request anything") {
  auto hook = keel::testing::Plugin(keel_plugin_entry())
                  .create<keel_hook>("@{component}", {{"target_loss", 0.5}});
  CHECK(send(hook, KEEL_EVENT_METRICS, {0.1}) == std::vector<uint32_t>{0});
  CHECK(send(hook, KEEL_EVENT_STEP_START, {0.1}) == std::vector<uint32_t>{0});
}

TEST_CASE("@{component}: the default target_loss, 0, never stops") {
  auto hook = keel::testing::Plugin(keel_plugin_entry()).create<keel_hook>("@{component}");
  CHECK(send(hook, KEEL_EVENT_STEP_END, {1.0, 1e-9, 0.0, -1.0}) ==
        std::vector<uint32_t>{0, 0, 0, 0});
}
