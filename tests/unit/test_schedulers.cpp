// LR schedules as the kernel loads them (the schedulers plugin through the registry): factor
// values at the key steps against the formulas, written out again here, and the creation
// errors of impossible combinations.
#include <cmath>

#include "components.hpp"
#include "host.hpp"
#include "loader/registry.hpp"
#include "support.hpp"

namespace unit_schedulers {  // keel_units is one unity build: each file's names stay its own

namespace {

const keel::Registry& registry() { return keel_test::default_registry(); }

// Scheduler `name` with the options in `toml_text` (defaults for the rest) in a run of
// `run_steps` planned optimizer steps.
struct Schedule {
  keel::Instance<keel_lr_scheduler> inst;
  double operator()(int64_t step) const { return inst->factor(inst.self(), step); }
};

Schedule make(const std::string& name, const std::string& toml_text, int64_t run_steps = 1000) {
  const keel::Component* c = registry().find(KEEL_KIND_LR_SCHEDULER, name);
  REQUIRE_MESSAGE(c != nullptr, "no lr_scheduler '" << name << "' found");
  const keel_options options =
      keel::validate_options(toml::parse(toml_text), "lr_scheduler", name, c->options);
  keel_create_context ctx{};
  ctx.host = keel::host();
  ctx.options = &options;
  ctx.section = "lr_scheduler";
  ctx.total_steps = run_steps;
  return {keel::create_instance<keel_lr_scheduler>(*c, ctx)};
}

std::string creation_error(const std::string& name, const std::string& toml_text,
                           int64_t run_steps = 1000) {
  return keel_test::error_of([&] { make(name, toml_text, run_steps); });
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

double ramp(int64_t step, int64_t warmup) { return static_cast<double>(step + 1) / warmup; }

// Checks the warmup ramp, then that the factor never rises from `from` to `to`.
void check_warmup_then_falling(const Schedule& f, int64_t warmup, int64_t from, int64_t to) {
  for (int64_t s = 0; s < warmup; ++s) CHECK(f(s) == doctest::Approx(ramp(s, warmup)));
  for (int64_t s = from; s < to; ++s) {
    CAPTURE(s);
    CHECK(f(s + 1) <= f(s));
  }
}

}  // namespace

TEST_CASE("constant: warmup ramp (step + 1) / warmup, then 1") {
  const Schedule f = make("constant", "warmup_steps = 10");
  CHECK(f(0) == doctest::Approx(0.1));
  CHECK(f(4) == doctest::Approx(0.5));
  CHECK(f(9) == 1.0);
  CHECK(f(10) == 1.0);
  CHECK(f(100000) == 1.0);
  CHECK(make("constant", "")(0) == 1.0);
}

TEST_CASE("step: gamma^floor((step - warmup) / step_size) after warmup") {
  const Schedule f = make("step", "warmup_steps = 5\nstep_size = 10\ngamma = 0.5");
  check_warmup_then_falling(f, 5, 5, 100);
  CHECK(f(5) == 1.0);
  CHECK(f(14) == 1.0);
  CHECK(f(15) == 0.5);
  CHECK(f(24) == 0.5);
  CHECK(f(25) == 0.25);
  CHECK(f(5 + 10 * 7) == doctest::Approx(std::pow(0.5, 7)));
  CHECK(make("step", "step_size = 3")(3) == doctest::Approx(0.1));  // gamma defaults to 0.1
  CHECK(contains(creation_error("step", ""), "step_size"));         // no default
}

TEST_CASE("linear: Hugging Face's linear decay after keel's warmup ramp") {
  const Schedule f = make("linear", "warmup_steps = 100");
  check_warmup_then_falling(f, 100, 100, 1200);
  for (int64_t s : {100, 101, 550, 999, 1000}) {
    CAPTURE(s);
    CHECK(f(s) == doctest::Approx((1000.0 - s) / (1000 - 100)));  // HF's lr_lambda
  }
  CHECK(f(5000) == 0.0);
  // min_factor and an explicit total_steps (instead of the run's length).
  const Schedule g = make("linear", "total_steps = 500\nmin_factor = 0.2", 99999);
  CHECK(g(0) == 1.0);
  CHECK(g(250) == doctest::Approx(0.2 + 0.8 * 0.5));
  CHECK(g(500) == doctest::Approx(0.2));
  CHECK(g(700) == doctest::Approx(0.2));
}

TEST_CASE("cosine: the formula is unchanged") {
  const Schedule f = make("cosine", "warmup_steps = 100\nmin_factor = 0.1");
  check_warmup_then_falling(f, 100, 100, 1200);
  for (int64_t s : {100, 325, 550, 999, 1000, 1500}) {
    CAPTURE(s);
    const double progress = std::min(1.0, (s - 100) / 900.0);
    CHECK(f(s) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * progress))));
  }
}

TEST_CASE("wsd: warmup, stable at 1, then the last decay steps down to min_factor") {
  const Schedule f = make("wsd", "warmup_steps = 10\ndecay_fraction = 0.2\nmin_factor = 0.1");
  check_warmup_then_falling(f, 10, 10, 1100);
  for (int64_t s : {10, 500, 799, 800}) CHECK(f(s) == 1.0);  // decay: the last 200 steps
  CHECK(f(900) == doctest::Approx(0.1 + 0.9 * 0.5));
  CHECK(f(1000) == doctest::Approx(0.1));
  CHECK(f(1200) == doctest::Approx(0.1));

  const std::string base = "warmup_steps = 10\ndecay_steps = 100\n";  // wins over the fraction
  const Schedule cosine = make("wsd", base + "decay_shape = \"cosine\"");
  const Schedule sqrt = make("wsd", base + "decay_shape = \"sqrt\"");
  CHECK(cosine(899) == 1.0);
  CHECK(sqrt(899) == 1.0);
  for (int64_t s : {900, 925, 960, 999, 1000}) {
    CAPTURE(s);
    const double p = (s - 900) / 100.0;
    CHECK(cosine(s) == doctest::Approx(0.5 * (1 + std::cos(M_PI * p))));
    CHECK(sqrt(s) == doctest::Approx(1 - std::sqrt(p)));
  }
}

TEST_CASE("impossible combinations fail at creation, saying why and what to change") {
  std::string e = creation_error("wsd", "warmup_steps = 900\ndecay_fraction = 0.2");
  CHECK(contains(e, "[lr_scheduler] lr_scheduler 'wsd'"));
  CHECK(contains(e, "warmup_steps (900) + decay (200 steps) exceed total_steps (1000)"));
  CHECK(contains(e, "hint: "));
  e = creation_error("wsd", "decay_steps = 1001");
  CHECK(contains(e, "decay (1001 steps) exceed total_steps (1000)"));
  for (const char* name : {"linear", "cosine"}) {
    CAPTURE(name);
    // A run shorter than its warmup (a short debug run) only warns.
    CHECK(creation_error(name, "warmup_steps = 2000") == "<no error>");
    CHECK(contains(creation_error(name, "", 0), "needs the run's length; hint: set total_steps"));
  }
  CHECK(creation_error("wsd", "warmup_steps = 800\ndecay_fraction = 0.2") == "<no error>");
  CHECK(creation_error("wsd", "warmup_steps = 2000") == "<no error>");
}

}  // namespace unit_schedulers
