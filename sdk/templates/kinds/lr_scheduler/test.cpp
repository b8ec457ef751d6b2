#include <cmath>

TEST_CASE("@{component}: the factor at step s is gamma^s") {
  const double gamma = 0.5;
  auto scheduler =
      keel::testing::Plugin(keel_plugin_entry()).create<keel_lr_scheduler>("@{component}",
                                                                           {{"gamma", gamma}});
  for (int64_t step : {0, 1, 2, 7, 100})
    CHECK(scheduler.call(scheduler->factor, step) == doctest::Approx(std::pow(gamma, step)));
}

TEST_CASE("@{component}: gamma defaults to 0.999 and must lie in [0, 1]") {
  keel::testing::Plugin plugin(keel_plugin_entry());
  auto scheduler = plugin.create<keel_lr_scheduler>("@{component}");
  CHECK(scheduler.call(scheduler->factor, 1000) == doctest::Approx(std::pow(0.999, 1000)));
  CHECK_THROWS_WITH(plugin.create<keel_lr_scheduler>("@{component}", {{"gamma", 1.5}}),
                    doctest::Contains("test.gamma: must be in [0, 1], got 1.5"));
}
