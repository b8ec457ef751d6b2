// The file-system layer (kernel/files) and the text helpers (sdk/host/text, keel/tensor.hpp).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "files/files.hpp"
#include "keel/tensor.hpp"
#include "support.hpp"
#include "text/text.hpp"

namespace unit_files_text {  // keel_units is one unity build: each file's names stay its own

namespace fs = std::filesystem;
using keel_test::TempDir;

// The FileError `f` throws: its message and errno.
template <class F>
std::pair<std::string, int> file_error_of(F&& f) {
  try {
    f();
  } catch (const keel::FileError& e) {
    return {e.what(), e.code()};
  }
  return {"<no error>", 0};
}

TEST_CASE("durable writes and renames; neutral messages that name the path and errno") {
  TempDir d;
  const std::string a = (d.path / "a").string(), b = (d.path / "b").string();
  keel::write_file_durably(a, "one", 0600);
  CHECK(keel::read_file(a) == "one");
  struct stat st {};
  REQUIRE(::stat(a.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  // A new file only: an existing one is an error, and keeps its content.
  const auto [exists, code] = file_error_of([&] { keel::write_file_durably(a, "two"); });
  CHECK(exists == "creating " + a + " failed: File exists");
  CHECK(code == EEXIST);
  CHECK(keel::read_file(a) == "one");

  keel::write_file_durably(b, "two");
  CHECK_FALSE(keel::durable_rename_new(a, b));  // b exists: nothing moves
  CHECK(keel::read_file(a) == "one");
  if (keel::durable_exchange(a, b)) {  // where the file system can exchange
    CHECK(keel::read_file(a) == "two");
    CHECK(keel::read_file(b) == "one");
  }
  keel::durable_rename(a, b);
  CHECK_FALSE(fs::exists(a));
  const std::string c = (d.path / "sub" / "c").string();
  fs::create_directory(d.path / "sub");
  CHECK(keel::durable_rename_new(b, c));
  CHECK_FALSE(fs::exists(b));
  CHECK(file_error_of([&] { keel::durable_rename(b, c); }).first ==
        "renaming " + b + " to " + c + " failed: No such file or directory");
  CHECK(file_error_of([&] { keel::read_file(b); }).first ==
        "opening " + b + " failed: No such file or directory");
}

TEST_CASE("read_file: whole files, links refused on request; add_hint appends a caller's hint") {
  TempDir d;
  const std::string big(200000, 'x');
  const fs::path f = d.write("f", big);
  CHECK(keel::read_file(f.string()) == big);
  fs::create_symlink(f, d.path / "link");
  const std::string link = (d.path / "link").string();
  CHECK(keel::read_file(link) == big);
  CHECK(file_error_of([&] { keel::read_file(link, /*follow_links=*/false); }).second == ELOOP);
  const std::string hinted = keel_test::error_of([&] {
    keel::add_hint([&] { return keel::read_file(link, false); },
                   [](int code) { return code == ELOOP ? "not a link" : "other"; });
  });
  CHECK(hinted ==
        "opening " + link + " failed: Too many levels of symbolic links; hint: not a link");
  CHECK(keel::parent_of("name") == ".");
  CHECK(keel::parent_of("/a/b") == "/a");
}

TEST_CASE("did you mean, join, one line, located, number, shape, shell word") {
  namespace text = keel::text;
  const std::vector<std::string> kinds = {"model", "dataset", "optimizer"};
  CHECK(text::closest("modle", kinds) == "model");
  CHECK(text::closest("zzzzzz", kinds).empty());
  CHECK(text::did_you_mean("optimiser", kinds) == "did you mean 'optimizer'? ");
  CHECK(text::did_you_mean("zzzzzz", kinds).empty());
  CHECK(text::did_you_mean_or("datset", kinds, "use one of them") == "did you mean 'dataset'?");
  CHECK(text::did_you_mean_or("zzzzzz", kinds, "use one of them") == "use one of them");
  CHECK(text::did_you_mean_or("modl", kinds, "", '"') == "did you mean \"model\"?");
  // Case does not count against a candidate: "adamW" is adamw, not adam (1 edit from both).
  CHECK(text::closest("adamW", {"sgd", "adam", "adamw"}) == "adamw");
  CHECK(text::closest("ADAM", {"adam", "adamw"}) == "adam");
  CHECK(text::closest("Modle", kinds) == "model");
  // A name whose initials are a candidate, or a candidate's initials: learning_rate is lr.
  const std::vector<std::string> adamw = {"lr", "beta1", "beta2", "eps", "weight_decay"};
  CHECK(text::closest("learning_rate", adamw) == "lr");
  CHECK(text::closest("Learning_Rate", adamw) == "lr");
  CHECK(text::closest("wd", adamw) == "weight_decay");
  CHECK(text::closest("lr", {"momentum", "learning_rate"}) == "learning_rate");
  CHECK(text::closest("a_b_c", adamw).empty());
  CHECK(text::join(kinds) == "model, dataset, optimizer");
  CHECK(text::join(kinds, "; ") == "model; dataset; optimizer");
  CHECK(text::join(std::vector<std::string>{}).empty());
  CHECK(text::join(std::vector<int>{1, 2}) == "1, 2");
  CHECK(text::one_line("\nfailed:\n\tat x\r\nend\n") == "failed: at x end");
  struct Region {
    struct {
      unsigned line, column;
    } begin;
  };
  CHECK(text::located("m.toml", Region{{3, 7}}) == "m.toml:3:7");
  CHECK(text::located("m.toml", Region{{0, 0}}) == "m.toml");
  CHECK(text::number(0.1) == "0.1");
  CHECK(text::number(3) == "3");
  CHECK(text::number(std::numeric_limits<double>::quiet_NaN()) == "nan");
  CHECK(text::shape({2, 3}) == "[2, 3]");
  CHECK(text::shape({}) == "[]");
  // Data bytes in a message: control bytes, C1 controls and invalid UTF-8 as \xNN.
  CHECK(text::printable("plain text, caf\xc3\xa9, \xe4\xb8\xad, \xf0\x9f\x98\x80 a\\b") ==
        "plain text, caf\xc3\xa9, \xe4\xb8\xad, \xf0\x9f\x98\x80 a\\b");
  CHECK(text::printable("\x1b[2Jred\x07") == "\\x1b[2Jred\\x07");
  CHECK(text::printable(std::string("a\0b\n\x7f", 5)) == "a\\x00b\\x0a\\x7f");
  CHECK(text::printable("\xc2\x9b" "31m") == "\\xc2\\x9b" "31m");  // C1 CSI in UTF-8
  CHECK(text::printable("\x9b\xff\xc0\xaf") == "\\x9b\\xff\\xc0\\xaf");  // invalid, overlong
  CHECK(text::printable("\xed\xa0\x80") == "\\xed\\xa0\\x80");  // a surrogate
  CHECK(text::printable("cut\xe4\xb8") == "cut\\xe4\\xb8");  // truncated at the end
  // One shell word: as it is when no shell reads a character of it specially, else quoted.
  CHECK(text::shell_word("build/kernel/keel") == "build/kernel/keel");
  CHECK(text::shell_word("optimizer.lr=0.0003") == "optimizer.lr=0.0003");
  CHECK(text::shell_word("my runs/keel") == "'my runs/keel'");
  CHECK(text::shell_word("model.hidden=[256, 128]") == "'model.hidden=[256, 128]'");
  CHECK(text::shell_word("it's") == "'it'\\''s'");
  CHECK(text::shell_word("") == "''");
}

TEST_CASE("one dtype table: keel_dtype, LibTorch scalar type and name agree both ways") {
  for (const keel::Dtype& d : keel::kDtypes) {
    CHECK(keel::dtype_of(d.torch) == &d);
    CHECK(keel::dtype_of(d.keel) == &d);
    CHECK(keel::dtype_named(d.name) == &d);
  }
  CHECK(keel::dtype_of(at::kBFloat16)->name == std::string("BF16"));
  CHECK((keel::dtype_of(KEEL_DTYPE_U8)->torch == at::kByte));
  CHECK(keel::dtype_of(at::kComplexFloat) == nullptr);
  CHECK(keel::dtype_named("F8_E4M3") == nullptr);
}

}  // namespace unit_files_text
