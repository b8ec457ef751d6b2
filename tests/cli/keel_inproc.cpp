// keel_inproc: runs keel command lines in this one process through keel::cli_main, the function
// the `keel` executable runs, so that a catalogue of cases pays LibTorch's start-up once instead
// of once per case (tests/cli/inproc.py drives it for test_bad_input.py and test_misbehave.py).
//
// Usage: keel_inproc RESULTS_FD
// Cases come on stdin, one JSON object a line:
//   {"id": ..., "argv": ["keel", "validate", "m.toml"], "cwd": DIR, "env": {NAME: VALUE},
//    "unset": [NAME], "stdout": FILE, "stderr": FILE}
// For each, keel_inproc sets the environment and working directory, points file descriptors 1
// and 2 at the two files (created or truncated: everything keel, its plugins, LibTorch and
// spdlog write there lands in them), calls keel::cli_main, puts descriptors, directory and
// environment back, and writes one JSON line to RESULTS_FD:
//   {"id": ..., "status": N, "leaks": ["..."]}
// `leaks` names the process-global state the case left changed that the next case would see:
// open file descriptors (beside those the plugin registry keeps for the life of the process, by
// design), the working directory, the environment, the umask, signal dispositions, the
// std::terminate handler, spdlog's loggers and levels, a run log still attached or messages kept
// for one, LibTorch's thread count (against the previous case's, once LibTorch settled it), and
// more threads than the cores plus 8.
//
// A case that ends the process (keel's internal-error exit 70, a signal) ends keel_inproc with
// it; the files then hold what the case wrote, and the driver reports that case alone.
#include <ATen/Parallel.h>
#include <dirent.h>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <spdlog/sinks/sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_main.hpp"
#include "log.hpp"

extern char** environ;

namespace {

using json = nlohmann::json;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "keel_inproc: %s\n", what.c_str());
  std::exit(3);
}

std::string cwd() {
  char buf[PATH_MAX];
  return getcwd(buf, sizeof buf) ? std::string(buf) : std::string("?");
}

std::map<std::string, std::string> environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    env[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
  }
  return env;
}

void set_environment(const std::map<std::string, std::string>& want) {
  const std::map<std::string, std::string> now = environment();
  for (const auto& [k, v] : now)
    if (!want.count(k)) unsetenv(k.c_str());
  for (const auto& [k, v] : want) {
    const auto it = now.find(k);
    if (it == now.end() || it->second != v) setenv(k.c_str(), v.c_str(), 1);
  }
}

// Open descriptors and what they point at.
std::map<int, std::string> open_fds() {
  std::map<int, std::string> fds;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return fds;
  const int own = dirfd(d);
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    if (fd == own) continue;
    char buf[PATH_MAX];
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = readlink(link.c_str(), buf, sizeof buf - 1);
    fds[fd] = n > 0 ? std::string(buf, n) : "?";
  }
  closedir(d);
  return fds;
}

// The registry keeps one descriptor per plugin content for the life of the process, a sealed
// memfd named after the file ("/memfd:NAME.so (deleted)"), and one per library of a plugin's own
// that it preloaded (named after its soname): dlopen knows each by /proc/self/fd/N
// (kernel/loader/registry.cpp, dependencies.cpp). Shared objects, not leaks.
bool plugin_descriptor(const std::string& target) {
  const std::string t = target.substr(0, target.rfind(" (deleted)"));
  return t.size() > 3 && (t.compare(t.size() - 3, 3, ".so") == 0 || t.find(".so.") != t.npos);
}

int thread_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

std::vector<std::string> dispositions() {
  std::vector<std::string> out;
  for (int s = 1; s < NSIG; ++s) {
    if (s == SIGKILL || s == SIGSTOP) continue;
    struct sigaction sa {};
    if (sigaction(s, nullptr, &sa) != 0) continue;
    // (glibc adds SA_RESTORER to a disposition it installs: not compared.)
    const int flags = sa.sa_flags & (SA_SIGINFO | SA_RESTART | SA_ONSTACK | SA_NODEFER |
                                     SA_RESETHAND | SA_NOCLDSTOP | SA_NOCLDWAIT);
    std::ostringstream o;
    o << s << ":" << reinterpret_cast<void*>(sa.sa_handler) << ":" << flags;
    out.push_back(o.str());
  }
  return out;
}

mode_t current_umask() {
  const mode_t m = umask(022);
  umask(m);
  return m;
}

std::string logger_state() {
  std::ostringstream o;
  const auto logger = spdlog::default_logger();
  o << "default logger '" << logger->name() << "' level "
    << spdlog::level::to_string_view(logger->level()).data() << ", sinks";
  for (const auto& s : logger->sinks()) o << " " << spdlog::level::to_string_view(s->level()).data();
  int loggers = 0;
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>&) { ++loggers; });
  o << ", " << loggers << " registered";
  return o.str();
}

// What a fresh process holds and each case must leave: either spdlog's own default logger or
// keel's at the console level info (logger debug: run.log's detail), no run log attached.
bool logger_clean(const std::string& state) {
  return state == "default logger '' level info, sinks trace, 1 registered" ||
         state == "default logger 'keel' level debug, sinks info debug, 1 registered";
}

// Messages kept for a run log that never came would reach the next case's run.log: attaching a
// run log must write only its own "run log:" line (the console is at info: nothing shows).
std::string kept_messages(const std::string& scratch) {
  if (spdlog::default_logger()->name() != "keel") return "";
  keel::attach_run_log(scratch);
  keel::detach_run_log();
  std::ifstream f(scratch);
  std::string line, extra;
  int lines = 0;
  while (std::getline(f, line))
    if (++lines > 1 || line.find("] run log: ") == std::string::npos) extra += line + "\n";
  unlink(scratch.c_str());
  return extra;
}

void redirect(int fd, const std::string& path) {
  const int f = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f < 0) die(path + ": " + std::strerror(errno));
  if (dup2(f, fd) < 0) die(std::string("dup2: ") + std::strerror(errno));
  close(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) die("usage: keel_inproc RESULTS_FD (cases on stdin, one JSON object a line)");
  const int results_fd = std::atoi(argv[1]);
  std::FILE* results = fdopen(results_fd, "w");
  if (!results) die(std::string("RESULTS_FD ") + argv[1] + ": " + std::strerror(errno));
  // The cases come on a private descriptor; keel's stdin is /dev/null, as no case reads it.
  const int cases_fd = fcntl(0, F_DUPFD_CLOEXEC, 10);
  const int null = open("/dev/null", O_RDONLY);
  if (cases_fd < 0 || null < 0 || dup2(null, 0) < 0) die("cannot set up stdin");
  close(null);
  fcntl(results_fd, F_SETFD, FD_CLOEXEC);
  std::FILE* cases = fdopen(cases_fd, "r");
  const int saved_out = fcntl(1, F_DUPFD_CLOEXEC, 10);
  const int saved_err = fcntl(2, F_DUPFD_CLOEXEC, 10);
  if (!cases || saved_out < 0 || saved_err < 0) die("cannot keep descriptors 0 to 2");

  const std::string home_dir = cwd();
  const std::map<std::string, std::string> env0 = environment();
  const std::vector<std::string> signals0 = dispositions();
  const mode_t umask0 = current_umask();
  const int max_threads = static_cast<int>(std::thread::hardware_concurrency()) + 8;
  std::set<int> kept_fds;  // plugin descriptors seen so far (kept by design)
  const int torch_threads0 = at::get_num_threads();
  int torch_threads_before = torch_threads0;  // LibTorch's thread count after the previous case

  std::string line;
  char* buf = nullptr;
  size_t cap = 0;
  ssize_t n;
  while ((n = getline(&buf, &cap, cases)) > 0) {
    line.assign(buf, n);
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    const json c = json::parse(line);
    std::vector<std::string> args = c.at("argv").get<std::vector<std::string>>();
    std::vector<char*> cargv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);

    std::map<std::string, std::string> env = env0;
    const json unset = c.value("unset", json::array()), set = c.value("env", json::object());
    for (const auto& u : unset) env.erase(u.get<std::string>());
    for (const auto& [k, v] : set.items()) env[k] = v.get<std::string>();
    set_environment(env);
    const std::string dir = c.value("cwd", home_dir);
    if (chdir(dir.c_str()) != 0) die(dir + ": " + std::strerror(errno));

    const std::map<int, std::string> fds_before = open_fds();
    const std::terminate_handler terminate_before = std::get_terminate();
    std::fflush(stdout);
    std::fflush(stderr);
    redirect(1, c.at("stdout").get<std::string>());
    redirect(2, c.at("stderr").get<std::string>());
    const int status = keel::cli_main(static_cast<int>(args.size()), cargv.data());
    std::fflush(stdout);
    std::fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);

    std::vector<std::string> leaks;
    for (const auto& [fd, target] : open_fds()) {
      if (fds_before.count(fd) && fds_before.at(fd) == target) continue;
      if (plugin_descriptor(target) && kept_fds.insert(fd).second) continue;
      leaks.push_back("file descriptor " + std::to_string(fd) + " open on " + target);
    }
    for (const auto& [fd, target] : fds_before)
      if (!open_fds().count(fd)) leaks.push_back("file descriptor " + std::to_string(fd) +
                                                 " (" + target + ") closed by the case");
    if (cwd() != dir) leaks.push_back("working directory changed to " + cwd());
    for (const auto& [k, v] : environment())
      if (!env.count(k) || env.at(k) != v) leaks.push_back("environment variable " + k + " set");
    for (const auto& [k, v] : env)
      if (!getenv(k.c_str())) leaks.push_back("environment variable " + k + " unset");
    if (current_umask() != umask0) leaks.push_back("umask changed");
    if (dispositions() != signals0) leaks.push_back("signal dispositions changed");
    if (std::get_terminate() != terminate_before)
      leaks.push_back("std::terminate handler changed");
    const std::string logger = logger_state();
    if (!logger_clean(logger)) leaks.push_back("spdlog: " + logger);
    if (!keel::run_log_path().empty())
      leaks.push_back("run log still attached: " + keel::run_log_path());
    const std::string kept = kept_messages(c.at("stderr").get<std::string>() + ".runlog");
    if (!kept.empty()) leaks.push_back("log messages kept for the next run log: " + kept);
    // (Against the previous case's count, once it moved from the count read at start: LibTorch
    // reads 1 before its first run here and settles its default during that run.)
    const int torch_threads = at::get_num_threads();
    if (torch_threads_before != torch_threads0 && torch_threads != torch_threads_before)
      leaks.push_back("LibTorch threads " + std::to_string(torch_threads_before) + " -> " +
                      std::to_string(torch_threads));
    torch_threads_before = torch_threads;
    if (thread_count() > max_threads)
      leaks.push_back(std::to_string(thread_count()) + " threads (more than " +
                      std::to_string(max_threads) + ")");

    set_environment(env0);
    if (chdir(home_dir.c_str()) != 0) die(home_dir + ": " + std::strerror(errno));
    json r = {{"id", c.at("id")}, {"status", status}, {"leaks", leaks}};
    std::fprintf(results, "%s\n", r.dump().c_str());
    std::fflush(results);
  }
  std::free(buf);
  return 0;
}
