#include "log.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>

#include "error.hpp"
#include "text/text.hpp"

namespace keel {
namespace {

// %* is a message as keel::text::printable shows it, on one line (see Printable).
constexpr const char* kFilePattern = "[%Y-%m-%d %T.%e] [%l] %*";
// Messages kept while no run log is attached (the oldest are dropped beyond this).
constexpr size_t kMaxPending = 10000;

// The pattern flag %*: the message on one line with its control bytes, C1 controls and invalid
// UTF-8 written as \xNN, so that bytes from data (a field, a file name, a plugin's text) cannot
// move the cursor, recolour or clear a terminal showing the console or run.log.
class Printable final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string text =
        text::printable(text::one_line(std::string(msg.payload.data(), msg.payload.size())));
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<Printable>();
  }
};

std::unique_ptr<spdlog::formatter> formatter(const std::string& pattern) {
  auto f = std::make_unique<spdlog::pattern_formatter>();
  f->add_flag<Printable>('*').set_pattern(pattern);
  return f;
}

// The run-log sink: writes to run.log while one is attached, else keeps the messages in memory
// so that the start of the run (command line, manifest, plugins) still reaches run.log.
class RunLogSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  RunLogSink() : formatter_(formatter(kFilePattern)) {}
  ~RunLogSink() override { close(); }

  void attach(int fd, const std::string& path) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::FILE* f = ::fdopen(fd, "a");
    if (!f) {
      const int err = errno;
      ::close(fd);
      throw Error(path + ": cannot write the run log: " + std::strerror(err) +
                  "; hint: set [run] output_dir to a writable directory");
    }
    close();
    file_ = f;
    path_ = path;
    for (const auto& m : pending_) write(m);
    pending_.clear();
    std::fflush(file_);
  }
  void detach() {
    std::lock_guard<std::mutex> lock(mutex_);
    close();
  }
  // Detached, and the messages kept for a run log dropped.
  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    close();
    pending_.clear();
  }
  std::string path() {
    std::lock_guard<std::mutex> lock(mutex_);
    return path_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (file_) return write(msg);
    if (pending_.size() >= kMaxPending) pending_.pop_front();
    pending_.emplace_back(msg);
  }
  void flush_() override {
    if (file_) std::fflush(file_);
  }
  // The file keeps its own pattern; the logger's set_pattern (console) does not apply here.
  void set_pattern_(const std::string&) override {}
  void set_formatter_(std::unique_ptr<spdlog::formatter>) override {}

 private:
  void write(const spdlog::details::log_msg& msg) {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    std::fwrite(buf.data(), 1, buf.size(), file_);
  }
  void close() {
    if (file_) std::fclose(file_);
    file_ = nullptr;
    path_.clear();
  }

  std::unique_ptr<spdlog::formatter> formatter_;
  std::FILE* file_ = nullptr;
  std::string path_;
  std::deque<spdlog::details::log_msg_buffer> pending_;
};

struct Logging {
  std::shared_ptr<spdlog::sinks::sink> console;
  std::shared_ptr<RunLogSink> run_log;
  std::shared_ptr<spdlog::logger> logger;
  spdlog::level::level_enum console_level = spdlog::level::info;  // as asked for
  // Rank r > 0 before its training starts (set_log_rank until log_setup_done): its setup
  // lines repeat rank 0's, so its console shows them only at debug level.
  bool quiet_setup = false;
};

// The console's level: the one asked for, and during a quiet setup warn at least unless debug
// lines were asked for (info lines then count as debug).
void apply_console_level(Logging& l) {
  const bool quiet = l.quiet_setup && l.console_level > spdlog::level::debug;
  l.console->set_level(quiet ? std::max(l.console_level, spdlog::level::warn) : l.console_level);
}

// The console's pattern, with `tag` before each message. On a terminal each line first clears
// the line, so it replaces the console hook's progress bar (which the hook redraws below it)
// instead of mixing with it.
std::string console_pattern(const std::string& tag) {
  return (isatty(fileno(stdout)) ? "\r\033[K[%T] " : "[%T] ") + tag + "%*";
}

std::mutex g_mutex;
std::unique_ptr<Logging> g_logging;  // guarded by g_mutex

Logging& setup(std::optional<spdlog::level::level_enum> console_level) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_logging) {
    auto l = std::make_unique<Logging>();
    l->console = std::make_shared<spdlog::sinks::stdout_sink_mt>();
    l->console->set_formatter(formatter(console_pattern("")));
    l->run_log = std::make_shared<RunLogSink>();
    l->logger = std::make_shared<spdlog::logger>(
        "keel", spdlog::sinks_init_list{l->console, l->run_log});
    l->logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(l->logger);
    g_logging = std::move(l);
    if (!console_level) console_level = spdlog::level::info;
  }
  Logging& l = *g_logging;
  if (console_level) {
    l.console_level = *console_level;
    apply_console_level(l);
    // run.log: debug detail, and trace too when the console asks for it.
    l.run_log->set_level(std::min(*console_level, spdlog::level::debug));
    l.logger->set_level(std::min(*console_level, spdlog::level::debug));
  }
  return l;
}

}  // namespace

std::optional<spdlog::level::level_enum> parse_log_level(const std::string& name) {
  using spdlog::level::level_enum;
  static const std::pair<const char*, level_enum> kLevels[] = {
      {"trace", level_enum::trace}, {"debug", level_enum::debug}, {"info", level_enum::info},
      {"warn", level_enum::warn},   {"warning", level_enum::warn}, {"error", level_enum::err},
      {"off", level_enum::off},
  };
  for (const auto& [n, level] : kLevels)
    if (name == n) return level;
  return std::nullopt;
}

const char* log_level_names() { return "trace, debug, info, warn, error, off"; }

void init_logging(spdlog::level::level_enum console_level) { setup(console_level); }

void set_log_rank(int rank) {
  Logging& l = setup(std::nullopt);
  const std::string tag = "[rank " + std::to_string(rank) + "] ";
  l.console->set_formatter(formatter(console_pattern(tag)));
  std::lock_guard<std::mutex> lock(g_mutex);
  l.quiet_setup = rank > 0;
  apply_console_level(l);
}

void log_setup_done() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_logging || !g_logging->quiet_setup) return;
  g_logging->quiet_setup = false;
  apply_console_level(*g_logging);
}

void reset_logging() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_logging) return;
    g_logging->run_log->reset();
    g_logging->console->set_formatter(formatter(console_pattern("")));
    g_logging->quiet_setup = false;
  }
  setup(spdlog::level::info);
}

void attach_run_log(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(path + ": cannot write the run log: " +
                (errno == ELOOP ? std::string("it is a symbolic link") : std::strerror(errno)) +
                "; hint: set [run] output_dir to a writable directory");
  attach_run_log(fd, path);
}

void attach_run_log(int fd, const std::string& path) {
  setup(std::nullopt).run_log->attach(fd, path);
  spdlog::debug("run log: {}", path);
}

void detach_run_log() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_logging) g_logging->run_log->detach();
}

std::string run_log_path() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_logging ? g_logging->run_log->path() : std::string();
}

void run_log_only(spdlog::level::level_enum level, const std::string& message) {
  Logging& l = setup(std::nullopt);
  if (!l.run_log->should_log(level)) return;
  spdlog::details::log_msg msg(l.logger->name(), level, message);
  l.run_log->log(msg);
  l.run_log->flush();
}

}  // namespace keel
