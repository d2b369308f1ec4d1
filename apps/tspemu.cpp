// The tspemu command. `tspemu run` (the main job) runs one TSP training step of a whole model and
// checks it against the reference; `tspemu selfcheck` exercises every collective of the runtime.
// Exit codes: 0 success, 1 a runtime failure or a failed check, 2 a bad configuration.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "selfcheck.hpp"
#include "tsp_run.hpp"

int main(int argc, char** argv) {
  CLI::App app{"tspemu: emulate a multi-GPU device group on one CPU"};
  app.require_subcommand(0, 1);

  tspemu::app::RunOptions ro;
  auto& m = ro.shape.model;
  std::string layout = "zigzag";
  auto* run = app.add_subcommand(
      "run",
      "one TSP forward+backward of a whole model, checked against the reference (the default)");
  run->add_option("--ranks,-D", ro.shape.D, "TSP degree D (ranks)")->capture_default_str();
  run->add_option("--batch,-B", ro.shape.B, "micro-batch B")->capture_default_str();
  run->add_option("--seq,-S", ro.shape.S, "sequence length S (divisible by 2D for zigzag)")
      ->capture_default_str();
  run->add_option("--layers", m.n_layers, "layers L")->capture_default_str();
  run->add_option("--hidden", m.hidden, "hidden size h")->capture_default_str();
  run->add_option("--heads", m.n_heads, "query heads (divisible by D)")->capture_default_str();
  run->add_option("--kv-heads", m.n_kv_heads, "key/value heads (divisible by D, dividing heads)")
      ->capture_default_str();
  run->add_option("--ffn", m.ffn, "gated-MLP width (divisible by D)")->capture_default_str();
  run->add_option("--vocab", m.vocab, "vocabulary size (divisible by D)")->capture_default_str();
  run->add_flag("--tied", m.tie_embeddings, "tie the LM head to the embedding");
  run->add_option("--layout", layout, "sequence layout: zigzag, contiguous or striped")
      ->capture_default_str();
  run->add_option("--head-buckets", ro.shape.options.head_buckets, "K/V all-gathers per head shard")
      ->capture_default_str();
  run->add_option("--seed", ro.seed, "weights and tokens seed")->capture_default_str();
  run->add_option("--json", ro.json_path, "also write the report as JSON to this file");

  tspemu::app::SelfcheckOptions sc;
  auto* check = app.add_subcommand("selfcheck",
                                   "run and verify every collective of the runtime, with timings");
  check->add_option("--ranks", sc.ranks, "ranks (threads) in the world")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  check->add_option("--count", sc.count, "float elements per rank")->capture_default_str();
  check->add_option("--iterations", sc.iterations, "timed calls per collective")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (check->parsed()) return tspemu::app::selfcheck(sc, std::cout) == 0 ? 0 : 1;
    ro.shape.options.layout = tspemu::tsp::parse_layout(layout);
    return tspemu::app::run_tsp_step(ro, std::cout);
  } catch (const std::invalid_argument& e) {
    std::cerr << "tspemu: invalid configuration: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "tspemu: " << e.what() << "\n";
    return 1;
  }
}
