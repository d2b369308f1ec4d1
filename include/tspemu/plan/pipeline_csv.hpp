// PyTorch pipelining's schedule CSV (torch/distributed/pipelining/schedules.py _dump_csv /
// _load_csv), read and written, so a PyTorch user's schedule table is checked here unchanged.
//
// What: row r is rank r's actions in order, one cell each, in to_string(Action)'s spelling
//   ("0F1", "1B0", "0W3", "1RECV_F0", ...); no header, no quoting. Two formats, as PyTorch's:
//   compute-only (F, B, I, W and the markers; empty cells are idle time steps) and compute + comms
//   (with SEND/RECV, as _PipelineScheduleRuntime runs it).
//   Reading: rows split on '\n' ("\r\n" accepted; a last newline ends the last row, it does not
//   start an empty one); empty cells skipped; the ranks are the rows; the stages 0..(highest + 1)
//   and the microbatches 0..(highest + 1) unless given; each stage runs on the one row it appears
//   on. A table with no SEND/RECV is compute-only and gets its sends and receives from
//   lower_send_recv (as PyTorch's _load_csv(format="compute_only")); one with them is kept as
//   written. legacy_names reads torch 2.5's spelling, where "B" was the input-gradient pass (now
//   "I") and "BW" the full backward (now "B").
//   Writing: one row per rank, cells joined by ',', rows ended by '\n' (PyTorch's csv.writer ends
//   them with "\r\n"; both read back the same); compute-only drops SEND/RECV.
// Requirements: none for reading (any text is judged); writing needs every SEND/RECV to talk to
//   its default peer stage (the format cannot name another).
// Guarantees: from_csv(to_csv(s, f), s's shape) equals s but for its name ("csv") for a schedule
//   make_schedule builds, in both formats. Reading does not validate the schedule: check it with
//   check_schedule (pipeline_check.hpp). Errors are std::invalid_argument naming the line (rank),
//   the cell and its text; load_csv's also name the file.
// Cost: O(characters + actions).
#pragma once

#include <string>
#include <string_view>

#include "tspemu/plan/pipeline_schedule.hpp"

namespace tspemu::pipeline {

enum class CsvFormat { compute_only, compute_comms };

struct CsvOptions {
  ActivationShape shape;      // what every SEND/RECV carries (the CSV has no shapes)
  int microbatches = 0;       // 0: the highest microbatch + 1
  bool legacy_names = false;  // torch 2.5: "B" = input-gradient pass, "BW" = full backward
};

std::string to_csv(const Schedule& s, CsvFormat format = CsvFormat::compute_comms);
Schedule from_csv(std::string_view text, const CsvOptions& opt = {});

// The same through a file; errors name the path.
Schedule load_csv(const std::string& path, const CsvOptions& opt = {});
void save_csv(const std::string& path, const Schedule& s,
              CsvFormat format = CsvFormat::compute_comms);

}  // namespace tspemu::pipeline
