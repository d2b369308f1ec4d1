#include "tspemu/plan/pipeline_csv.hpp"

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <vector>

#include "tspemu/core/atomic_file.hpp"
#include "tspemu/core/regular_file.hpp"

namespace tspemu::pipeline {

namespace {

constexpr std::uint64_t kMaxCsvBytes = 64u << 20;

// The rows of `text`: split on '\n', a '\r' before it dropped, no empty row after the last '\n'.
std::vector<std::string_view> rows(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    out.push_back(line);
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return out;
}

std::vector<std::string_view> cells(std::string_view line) {
  std::vector<std::string_view> out;
  for (;;) {
    const std::size_t comma = line.find(',');
    out.push_back(line.substr(0, comma));
    if (comma == std::string_view::npos) return out;
    line.remove_prefix(comma + 1);
  }
}

// One cell: trimmed, quotes dropped; empty -> nullopt. torch 2.5's names mapped when asked.
std::optional<Action> parse_cell(std::string_view cell, const CsvOptions& opt) {
  while (!cell.empty() && (cell.front() == ' ' || cell.front() == '\t')) cell.remove_prefix(1);
  while (!cell.empty() && (cell.back() == ' ' || cell.back() == '\t')) cell.remove_suffix(1);
  if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"')
    cell = cell.substr(1, cell.size() - 2);
  if (cell.empty()) return std::nullopt;
  if (!opt.legacy_names) return parse_action(cell, opt.shape);
  std::string text(cell);
  const std::size_t digits = text.find_first_not_of("0123456789");
  if (digits != std::string::npos && text.compare(digits, 2, "BW") == 0) {
    text.erase(digits + 1, 1);  // "BW": the full backward, "B" today
    return parse_action(text, opt.shape);
  }
  Action a = parse_action(text, opt.shape);
  if (a.op == Op::backward) a.op = Op::backward_input;  // "B": the input-gradient pass
  return a;
}

std::string where(int line, int cell) {
  return "schedule CSV line " + std::to_string(line + 1) + " (rank " + std::to_string(line) +
         "), cell " + std::to_string(cell + 1);
}

// Sets s.stages, s.microbatches and s.stage_rank from the actions; `at[r][i]` is the CSV cell
// of action i of rank r, for the errors.
void infer_shape(Schedule& s, const std::vector<std::vector<int>>& at, int microbatches) {
  int top_stage = -1;
  int top_mb = -1;
  for (const auto& list : s.actions)
    for (const Action& a : list) {
      top_stage = std::max(top_stage, a.stage);
      top_mb = std::max(top_mb, a.microbatch);
    }
  if (top_stage < 0) throw std::invalid_argument("schedule CSV: no actions");
  s.stages = top_stage + 1;
  s.microbatches = microbatches > 0 ? microbatches : top_mb + 1;
  std::vector<std::pair<int, int>> first(s.stages, {-1, -1});  // stage -> (rank, cell)
  for (int r = 0; r < s.ranks; ++r)
    for (std::size_t i = 0; i < s.actions[r].size(); ++i) {
      const int k = s.actions[r][i].stage;
      if (first[k].first < 0) first[k] = {r, at[r][i]};
      if (first[k].first != r)
        throw std::invalid_argument(where(r, at[r][i]) + ": stage " + std::to_string(k) +
                                    " is already on rank " + std::to_string(first[k].first) + " (" +
                                    where(first[k].first, first[k].second) + ")");
    }
  for (int k = 0; k < s.stages; ++k) {
    if (first[k].first < 0)
      throw std::invalid_argument("schedule CSV: stage " + std::to_string(k) +
                                  " has no action on any rank (stages 0.." +
                                  std::to_string(top_stage) + " are named)");
    s.stage_rank.push_back(first[k].first);
  }
}

}  // namespace

std::string to_csv(const Schedule& s, CsvFormat format) {
  std::string out;
  for (int r = 0; r < s.ranks; ++r) {
    bool first = true;
    for (const Action& a : s.actions.at(r)) {
      if (is_comm(a.op) && format == CsvFormat::compute_only) continue;
      if (is_comm(a.op) && a.peer_stage != default_peer_stage(a.op, a.stage))
        throw std::invalid_argument("to_csv: rank " + std::to_string(r) + " " + to_string(a) +
                                    " talks to stage " + std::to_string(a.peer_stage) +
                                    "; PyTorch's CSV can only name stage " +
                                    std::to_string(default_peer_stage(a.op, a.stage)));
      out += (first ? "" : ",") + to_string(a);
      first = false;
    }
    out += '\n';
  }
  return out;
}

Schedule from_csv(std::string_view text, const CsvOptions& opt) {
  Schedule s;
  s.name = "csv";
  std::vector<std::vector<int>> at;  // rank -> action -> its cell
  bool comms = false;
  const auto lines = rows(text);
  for (int r = 0; r < static_cast<int>(lines.size()); ++r) {
    s.actions.emplace_back();
    at.emplace_back();
    const auto row = cells(lines[r]);
    for (int c = 0; c < static_cast<int>(row.size()); ++c) {
      try {
        if (const auto a = parse_cell(row[c], opt)) {
          s.actions.back().push_back(*a);
          at.back().push_back(c);
          comms = comms || is_comm(a->op);
        }
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(where(r, c) + ": " + e.what());
      }
    }
  }
  s.ranks = static_cast<int>(lines.size());
  infer_shape(s, at, opt.microbatches);
  return comms ? s : lower_send_recv(s, opt.shape);
}

Schedule load_csv(const std::string& path, const CsvOptions& opt) {
  const std::string text = read_regular_file(path, kMaxCsvBytes, "a schedule CSV");
  try {
    return from_csv(text, opt);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

void save_csv(const std::string& path, const Schedule& s, CsvFormat format) {
  write_file_atomically(path, to_csv(s, format));
}

}  // namespace tspemu::pipeline
