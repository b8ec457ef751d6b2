TEST_CASE("@{component}: achieved FLOP/s over peak_tflops * 1e12") {
  const double peak_tflops = 2.0, flops_per_sample = 6e9, samples_per_second = 100.0;
  auto mfu = keel::testing::Plugin(keel_plugin_entry())
                 .create<keel_mfu>("@{component}", {{"peak_tflops", peak_tflops}});
  CHECK(mfu.call(mfu->compute, flops_per_sample, samples_per_second) ==
        doctest::Approx(flops_per_sample * samples_per_second / (peak_tflops * 1e12)));
  // A model that does not report its FLOPs (0) gives 0.
  CHECK(mfu.call(mfu->compute, 0.0, samples_per_second) == 0.0);
}

TEST_CASE("@{component}: peak_tflops is required") {
  CHECK_THROWS_WITH(keel::testing::Plugin(keel_plugin_entry()).create<keel_mfu>("@{component}"),
                    doctest::Contains("[test] needs 'peak_tflops'"));
}
