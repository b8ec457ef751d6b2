// The command line's one usage-error type: a wrong command, argument or flag.
//
// cli_main prints it as "keel: error: <message>" plus the usage line of the command it names
// (usage_line), and exits 2. Every other failure is a keel::Error (one line, exit 1).
#pragma once

#include <string>
#include <utility>

#include "error.hpp"

namespace keel::cli {

class UsageError : public Error {
 public:
  // `command`: the command whose usage line follows the message ("train", "plugins", ...; ""
  // for keel's own).
  UsageError(const std::string& message, std::string command)
      : Error(message), command_(std::move(command)) {}
  const std::string& command() const { return command_; }

 private:
  std::string command_;
};

// "keel COMMAND ARGS  (`keel COMMAND --help` for more)" for a command of the table
// (commands.hpp), else keel's own usage line.
std::string usage_line(const std::string& command);

}  // namespace keel::cli
