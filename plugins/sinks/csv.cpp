// csv: one CSV file per split ("metrics_{split}.csv"). The header is "split" plus the keys of
// the split's first record; later records fill those columns (a missing key stays empty, a
// key the header lacks is left out with one warning). Files start afresh with their split's
// first record; in a resumed run they keep their header and the rows up to the step it resumes
// from, and the run appends to them.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "format.hpp"
#include "sinks.hpp"

namespace sinks {
namespace {

const std::string kSplitField = "{split}";

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (const char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string csv_value(const char* key, double v) {
  if (std::isfinite(v)) return exact_value(key, v);
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

std::string csv_line(const std::vector<std::string>& fields) {
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) line += (i ? "," : "") + csv_field(fields[i]);
  return line + "\n";
}

class Csv : public keel::Hook {
 public:
  explicit Csv(const keel::Context& ctx)
      : log_(ctx),
        template_(output_path(ctx)),
        resume_step_(ctx.resume_step()) {
    if (template_.find(kSplitField) == std::string::npos)
      throw std::runtime_error("path '" + template_ + "' has no {split}; hint: each split gets " +
                               "its own file, e.g. path = \"metrics_{split}.csv\"");
    const auto dir = std::filesystem::path(template_).parent_path();
    if (!dir.empty() && !std::filesystem::is_directory(dir))
      throw std::runtime_error("directory '" + dir.string() + "' of path '" + template_ +
                               "' does not exist; hint: create it or choose another path");
  }

  void on_event(keel_event& ev) override {
    if (ev.kind == KEEL_EVENT_TRAIN_END)
      for (auto& t : tables_) t.second.file->flush();
    if (ev.kind != KEEL_EVENT_METRICS || ev.split == nullptr) return;
    Table& t = table(ev);
    std::vector<std::string> row(t.header.size());
    row[0] = ev.split;
    std::string extra;
    for (size_t i = 0; i < ev.metric_count; ++i) {
      const keel_metric& m = ev.metrics[i];
      const auto at = std::find(t.header.begin() + 1, t.header.end(), m.key);
      if (at == t.header.end())
        extra += (extra.empty() ? "" : ", ") + std::string(m.key);
      else
        row[at - t.header.begin()] = csv_value(m.key, m.value);
    }
    t.file->write(csv_line(row));
    if (!extra.empty() && !t.warned) {
      t.warned = true;
      const std::string msg = "'" + t.file->path() + "' leaves out " + extra +
                              ": its columns are the keys of the split's first record";
      log_(KEEL_LOG_WARN, msg);
    }
  }

 private:
  struct Table {
    std::unique_ptr<OutputFile> file;
    std::vector<std::string> header;
    bool warned = false;
  };

  // The split's table, created (file and header) on its first record.
  Table& table(const keel_event& ev) {
    Table& t = tables_[ev.split];
    if (t.file) return t;
    std::string path = template_;
    path.replace(path.find(kSplitField), kSplitField.size(), ev.split);
    // A resumed run: the file's own header, and its rows up to the resumed step.
    std::vector<std::string> header = read_header(path);
    const auto step_column = std::find(header.begin(), header.end(), "step");
    if (resume_step_ > 0 && step_column != header.end()) {
      const size_t column = static_cast<size_t>(step_column - header.begin());
      const auto step_of = [column](const std::string& line) -> int64_t {
        size_t start = 0;
        for (size_t i = 0; i < column && start != std::string::npos; ++i)
          start = line.find(',', start) == std::string::npos ? std::string::npos
                                                               : line.find(',', start) + 1;
        if (start == std::string::npos) return -1;
        char* end = nullptr;
        const long long v = std::strtoll(line.c_str() + start, &end, 10);
        return end == line.c_str() + start ? -1 : static_cast<int64_t>(v);
      };
      keep_records_until(path, resume_step_, step_of);
      t.file = std::make_unique<OutputFile>(path, true);
      t.header = std::move(header);
      return t;
    }
    t.file = std::make_unique<OutputFile>(path, false);
    t.header = {"split"};
    for (size_t i = 0; i < ev.metric_count; ++i) t.header.emplace_back(ev.metrics[i].key);
    t.file->write(csv_line(t.header));
    return t;
  }

  // The columns of an existing file's first line (empty when there is none).
  static std::vector<std::string> read_header(const std::string& path) {
    std::vector<std::string> out;
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) return out;
    char buf[8192];
    if (std::fgets(buf, sizeof buf, f)) {
      std::string line = buf, field;
      while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
      for (char c : line) {
        if (c == ',') {
          out.push_back(field);
          field.clear();
        } else {
          field += c;
        }
      }
      out.push_back(field);
    }
    std::fclose(f);
    return out;
  }

  keel::Logger log_;
  std::string template_;
  int64_t resume_step_;
  std::map<std::string, Table> tables_;
};

const keel_option_desc kCsvOptions[] = {
    keel::opt_string("path", "\"metrics_{split}.csv\"",
                     "output file per split; {split} is replaced by the split's name (relative "
                     "paths: inside the run dir)"),
    kEveryRank,
};

}  // namespace

keel_component_desc csv_component() {
  return keel::component<OnRank<Csv>>("csv", "metric records as one CSV file per split",
                                      kCsvOptions);
}

}  // namespace sinks
