// Semantic versions and requirements (kernel/loader/semver.hpp): semver 2.0 precedence, Cargo's
// meaning of partial versions, ^ and ~ (with 0.x), pre-releases, and the error texts.
#include <doctest/doctest.h>

#include <string>

#include "error.hpp"
#include "loader/semver.hpp"

using keel::Version;
using keel::VersionRequirement;

namespace {

Version v(const std::string& s) { return Version::parse(s); }

bool ok(const std::string& req, const std::string& version) {
  return VersionRequirement::parse(req).matches(v(version));
}

std::string version_error(const std::string& s) {
  try {
    Version::parse(s);
  } catch (const keel::Error& e) {
    return e.what();
  }
  return "<parsed>";
}

std::string requirement_error(const std::string& s) {
  try {
    VersionRequirement::parse(s);
  } catch (const keel::Error& e) {
    return e.what();
  }
  return "<parsed>";
}

}  // namespace

TEST_CASE("versions parse and print back as written") {
  const Version x = v("1.22.333-rc.1+build.5");
  CHECK(x.major == 1);
  CHECK(x.minor == 22);
  CHECK(x.patch == 333);
  REQUIRE(x.pre.size() == 2);
  CHECK(x.pre[0] == "rc");
  CHECK(x.pre[1] == "1");
  CHECK(x.build == "build.5");
  CHECK(x.str() == "1.22.333-rc.1+build.5");
  CHECK(v("0.0.0").str() == "0.0.0");
  CHECK(v("1.0.0-x-y.0a").pre[0] == "x-y");  // '-' inside a pre-release identifier
  CHECK(Version::valid("10.20.30"));
  CHECK_FALSE(Version::valid("1.2"));
}

TEST_CASE("malformed versions say what is wrong") {
  CHECK(version_error("1.x.0") == "'1.x.0': not a version (MAJOR.MINOR.PATCH, e.g. 1.2.0)");
  CHECK(version_error("1.2") == "'1.2': not a version (MAJOR.MINOR.PATCH, e.g. 1.2.0)");
  CHECK(version_error("") == "'': not a version (MAJOR.MINOR.PATCH, e.g. 1.2.0)");
  CHECK(version_error("1.2.3.4") == "'1.2.3.4': not a version (MAJOR.MINOR.PATCH, e.g. 1.2.0)");
  CHECK(version_error("v1.2.3") == "'v1.2.3': not a version (MAJOR.MINOR.PATCH, e.g. 1.2.0)");
  CHECK(version_error("01.2.3") == "'01.2.3': a number must not have a leading zero ('01')");
  CHECK(version_error("1.2.3-rc.01") ==
        "'1.2.3-rc.01': numeric pre-release identifier '01' must not have a leading zero");
  CHECK(version_error("1.2.3-") == "'1.2.3-': empty pre-release identifier");
  CHECK(version_error("1.2.3-a..b") == "'1.2.3-a..b': empty pre-release identifier");
  CHECK(version_error("1.2.3-a_b") ==
        "'1.2.3-a_b': pre-release identifier 'a_b' may hold only 0-9, A-Z, a-z and '-'");
  CHECK(version_error("1.2.3+") == "'1.2.3+': empty build metadata identifier");
  CHECK(version_error("99999999999999999999.0.0") ==
        "'99999999999999999999.0.0': the number 99999999999999999999 is too large (at most 2^63 "
        "- 1)");
  // Build metadata may have leading zeros; pre-release may not.
  CHECK(v("1.0.0+001").build == "001");
}

TEST_CASE("precedence follows semver 2.0, build metadata ignored") {
  // The example chain of semver.org, item 11.
  const char* chain[] = {"1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta",
                         "1.0.0-beta",  "1.0.0-beta.2",  "1.0.0-beta.11",
                         "1.0.0-rc.1",  "1.0.0",         "1.0.1",
                         "1.1.0",       "2.0.0",         "10.0.0"};
  for (size_t i = 0; i + 1 < sizeof chain / sizeof chain[0]; ++i) {
    CAPTURE(chain[i]);
    CHECK(v(chain[i]) < v(chain[i + 1]));
    CHECK_FALSE(v(chain[i + 1]) < v(chain[i]));
  }
  CHECK(v("1.0.0+a") == v("1.0.0+b"));
  CHECK(v("1.0.0-rc.1+a") == v("1.0.0-rc.1"));
  CHECK(v("1.0.0-2") < v("1.0.0-10"));   // numeric identifiers compare as numbers
  CHECK(v("1.0.0-10") < v("1.0.0-9a"));  // numeric below alphanumeric
  CHECK(v("1.0.0-Z") < v("1.0.0-a"));    // ASCII order
}

TEST_CASE("comparators with full and partial versions") {
  CHECK(ok("1.2.3", "1.2.3"));
  CHECK_FALSE(ok("1.2.3", "1.2.4"));
  CHECK(ok("=1.2.3", "1.2.3+build"));
  CHECK(ok(">=1.2, <2", "1.2.0"));
  CHECK(ok(">=1.2, <2", "1.99.99"));
  CHECK_FALSE(ok(">=1.2, <2", "2.0.0"));
  CHECK_FALSE(ok(">=1.2, <2", "1.1.9"));
  CHECK(ok(">1.2", "1.3.0"));
  CHECK_FALSE(ok(">1.2", "1.2.9"));  // >1.2 means >=1.3.0
  CHECK(ok(">1", "2.0.0"));
  CHECK_FALSE(ok(">1", "1.9.0"));
  CHECK(ok("<=1.2", "1.2.9"));  // <=1.2 means <1.3.0
  CHECK_FALSE(ok("<=1.2", "1.3.0"));
  CHECK(ok("=1.2", "1.2.7"));  // =1.2 means >=1.2.0, <1.3.0
  CHECK_FALSE(ok("=1.2", "1.3.0"));
  CHECK(ok("1", "1.5.0"));
  CHECK_FALSE(ok("1", "2.0.0"));
  CHECK(ok(">1.2.3", "1.2.4"));
  CHECK_FALSE(ok(">1.2.3", "1.2.3"));
  CHECK(ok("<=1.2.3", "1.2.3"));
  CHECK(ok(" >= 1.2 ,  < 2 ", "1.5.0"));  // spaces around comparators and after operators
  CHECK(ok("*", "0.0.1"));
  CHECK(ok("*", "999.0.0"));
  CHECK(VersionRequirement().matches(v("3.0.0")));
  CHECK(VersionRequirement().str() == "*");
  CHECK(VersionRequirement::parse(">=1.2, <2").str() == ">=1.2, <2");
}

TEST_CASE("caret and tilde, with 0.x") {
  CHECK(ok("^1.2.3", "1.9.0"));
  CHECK_FALSE(ok("^1.2.3", "1.2.2"));
  CHECK_FALSE(ok("^1.2.3", "2.0.0"));
  CHECK(ok("^1.2", "1.2.0"));
  CHECK_FALSE(ok("^1.2", "2.0.0"));
  CHECK(ok("^0.2.3", "0.2.9"));
  CHECK_FALSE(ok("^0.2.3", "0.3.0"));  // 0.x: the minor is the breaking part
  CHECK_FALSE(ok("^0.2.3", "0.2.2"));
  CHECK(ok("^0.0.3", "0.0.3"));
  CHECK_FALSE(ok("^0.0.3", "0.0.4"));  // 0.0.x: only that patch
  CHECK(ok("^0.0", "0.0.9"));
  CHECK_FALSE(ok("^0.0", "0.1.0"));
  CHECK(ok("^0", "0.9.9"));
  CHECK_FALSE(ok("^0", "1.0.0"));
  CHECK(ok("^1", "1.9.9"));
  CHECK_FALSE(ok("^1", "2.0.0"));
  CHECK(ok("~1.2.3", "1.2.9"));
  CHECK_FALSE(ok("~1.2.3", "1.3.0"));
  CHECK_FALSE(ok("~1.2.3", "1.2.2"));
  CHECK(ok("~1.2", "1.2.0"));
  CHECK_FALSE(ok("~1.2", "1.3.0"));
  CHECK(ok("~1", "1.9.0"));
  CHECK_FALSE(ok("~1", "2.0.0"));
  CHECK(ok("~0.2.3", "0.2.5"));
  CHECK_FALSE(ok("~0.2.3", "0.3.0"));
}

TEST_CASE("pre-releases only match a comparator naming a pre-release of the same version") {
  CHECK_FALSE(ok("*", "1.0.0-rc.1"));
  CHECK_FALSE(ok(">=1.0.0", "2.0.0-rc.1"));
  CHECK_FALSE(ok("<2", "2.0.0-alpha"));  // below 2.0.0 by precedence, but a pre-release
  CHECK_FALSE(ok("^1.2", "1.3.0-beta"));
  CHECK(ok(">=1.3.0-rc.0", "1.3.0-rc.1"));
  CHECK(ok(">=1.3.0-rc.0", "1.3.0"));
  CHECK(ok(">=1.3.0-rc.0", "1.4.0"));
  CHECK_FALSE(ok(">=1.3.0-rc.0", "1.4.0-rc.1"));  // another MAJOR.MINOR.PATCH
  CHECK_FALSE(ok(">=1.3.0-rc.2", "1.3.0-rc.1"));
  CHECK(ok("^1.2.3-beta.2", "1.2.3-beta.10"));
  CHECK(ok("^1.2.3-beta.2", "1.5.0"));
  CHECK_FALSE(ok("^1.2.3-beta.2", "1.2.3-beta.1"));
  CHECK(ok("=1.0.0-rc.1", "1.0.0-rc.1+b"));
  CHECK(ok(">=1.0.0-rc.1, <1.0.1", "1.0.0-rc.2"));
  CHECK(ok("^0.0.3-rc.1", "0.0.3-rc.2"));
  CHECK_FALSE(ok("^0.0.3-rc.1", "0.0.4"));
}

TEST_CASE("malformed requirements name the comparator and the fault") {
  CHECK(requirement_error(">=1.x") ==
        "'>=1.x': not a version (MAJOR.MINOR.PATCH, or MAJOR.MINOR or MAJOR after an operator, "
        "e.g. >=1.2)");
  CHECK(requirement_error(">=1.2, <2.x") ==
        "'>=1.2, <2.x': in '<2.x': not a version (MAJOR.MINOR.PATCH, or MAJOR.MINOR or MAJOR "
        "after an operator, e.g. >=1.2)");
  CHECK(requirement_error("") == "'': an empty requirement; hint: write \"*\" for any version");
  CHECK(requirement_error(">=1,,<2") ==
        "'>=1,,<2': in '': an empty comparator (two commas, or a comma at an end)");
  CHECK(requirement_error(">=1.2-rc") ==
        "'>=1.2-rc': a pre-release needs all of MAJOR.MINOR.PATCH");
  CHECK(requirement_error("=>1.0") ==
        "'=>1.0': not a version (MAJOR.MINOR.PATCH, or MAJOR.MINOR or MAJOR after an operator, "
        "e.g. >=1.2)");
  CHECK(requirement_error(">=*") ==
        "'>=*': not a version (MAJOR.MINOR.PATCH, or MAJOR.MINOR or MAJOR after an operator, "
        "e.g. >=1.2)");
  CHECK(requirement_error("^01.2") == "'^01.2': a number must not have a leading zero ('01')");
}
