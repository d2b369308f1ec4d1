// A simulated clock for pipeline schedules (pipeline_schedule.hpp): integer costs per action,
// each rank's busy time and idle fraction as exact rationals, and the activations each stage
// holds at its peak — the bubble and memory formulas checked by running the table, not quoted.
//
// What: every rank runs its list in order from time 0. F, B, I, W take Costs' units (a stage of
//   an interleaved schedule is one chunk: F and B are the chunk's, so a rank's work is v·m·(F+B));
//   markers, SENDs and RECVs take none; a SEND posts its message at the sender's time; the compute
//   action consuming a message (F after its RECV_F, B or I after its RECV_B) starts no earlier
//   than the message's post time + Costs::message. The makespan is the latest end; rank r's idle
//   fraction is (makespan − busy_r) / makespan.
//   In flight: a stage's activation of a microbatch is held from its F to its last backward piece
//   (B, or W when split); peak_in_flight[s] is the most held at once, in microbatches, counted
//   along the rank's order (it does not depend on the costs); rank_peak_in_flight[r] the most
//   (stage, microbatch) activations rank r holds at once over all its stages.
// Closed forms (closed_form_bubble), idle fraction of every rank, F, B (= I + W) per stage:
//   gpipe, 1f1b        (p−1)/(m+p−1)                     any m ≥ 1
//   interleaved-1f1b   (p−1)/(v·m+p−1)                   m ≥ p (for m < p the simulated bubble
//                                                        is larger; no closed form is claimed)
//   zb-h1              (p−1)(F+I−W) / (m(F+I+W) + (p−1)(F+I−W)), i.e. (p−1)/(3m+p−1) at
//                      F = I = W (DualPipe's table: (p−1)(F+B−2W) idle, B = I + W)   m ≥ p
//   Peak activations per stage s: 1f1b min(p−s, m); gpipe m; zb-h1 min(p, m) (a W holds its
//   activation, so every stage holds stage 0's 1F1B peak). Per rank r of interleaved-1f1b: its
//   warm-up plus one, min((v−1)·g + 2(p−1−r) + 1, v·m) (g microbatches per round).
// Requirements: a schedule check_schedule accepts; costs ≥ 0, compute costs not all 0.
// Guarantees: simulate() throws std::invalid_argument with the checker's message for a schedule
//   it rejects (with sends never blocking, the clock's model: isend with unbounded buffering).
//   Fractions are reduced (den > 0).
// Cost: O(actions) time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tspemu/plan/pipeline_schedule.hpp"

namespace tspemu::pipeline {

struct Costs {
  std::int64_t forward = 1;
  std::int64_t backward = 2;         // a full B
  std::int64_t backward_input = 1;   // I
  std::int64_t backward_weight = 1;  // W
  std::int64_t message = 0;          // a message's latency
};

// An exact non-negative rational, reduced.
struct Fraction {
  std::int64_t num = 0;
  std::int64_t den = 1;
  static Fraction of(std::int64_t num, std::int64_t den);  // reduces; throws when den <= 0
  bool operator==(const Fraction&) const = default;
};
std::string to_string(const Fraction& f);  // "3/7"

struct Timeline {
  std::int64_t makespan = 0;
  std::vector<std::int64_t> busy;        // rank -> compute time
  std::vector<std::int64_t> finish;      // rank -> when its last action ends
  std::vector<int> peak_in_flight;       // stage -> most activations held at once (microbatches)
  std::vector<int> rank_peak_in_flight;  // rank -> most (stage, microbatch) activations at once
  Fraction idle_fraction(int rank) const;
};

Timeline simulate(const Schedule& s, const Costs& costs = {});

// The closed form above for (kind, p, m, v) under `costs`, or nullopt where none is claimed.
std::optional<Fraction> closed_form_bubble(Kind kind, int p, int m, int v, const Costs& costs = {});

}  // namespace tspemu::pipeline
