// `tspemu generate` (generate_command.hpp): the default run passes and reports every field; bad
// input exits 2 naming the flag and the value, writing nothing; greedy runs repeat bit for bit;
// seeded sampling repeats by seed; the trace holds the prefill and every decode step.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include "cli_outcome.hpp"
#include "cli_test_support.hpp"
#include "generate_run.hpp"
#include "tspemu/reference/decode.hpp"
#include "tspemu/reference/hf_checkpoint.hpp"
#include "tspemu/reference/init.hpp"
#include "tspemu/runtime/world.hpp"

namespace tspemu::app {
namespace {

namespace fs = std::filesystem;
using testing::Outcome;
using testing::temp_path;
using testing::tspemu;

using testing::read_json;

// The tokens of a run with `args` (and -q, --json).
std::vector<std::vector<std::int32_t>> tokens_of(std::vector<std::string> args,
                                                 const std::string& name) {
  const std::string json = temp_path(name);
  args.insert(args.begin(), "generate");
  for (const char* a : {"-q", "--json"}) args.emplace_back(a);
  args.push_back(json);
  const Outcome o = tspemu(args);
  EXPECT_EQ(o.code, 0) << o.out << o.err;
  return read_json(json).at("tokens").get<std::vector<std::vector<std::int32_t>>>();
}

// A one-layer checkpoint of `vocab` tokens saved in the test's temporary directory `name` (heads,
// KV heads, width and vocabulary divisible by 4: the default strategy's degree);
// max_positions > 0 sets its config's max_position_embeddings. Returns the directory.
std::string small_checkpoint(const std::string& name, int vocab, int max_positions = 0) {
  const ref::ModelConfig cfg{
      .vocab = vocab, .hidden = 32, .n_layers = 1, .n_heads = 4, .n_kv_heads = 4, .ffn = 48};
  std::string dir = temp_path(name);
  fs::remove_all(dir);
  ref::save_hf_checkpoint(dir, ref::init_weights<float>(cfg, 5));
  if (max_positions > 0) {
    nlohmann::json config = read_json(dir + "/config.json");
    config["max_position_embeddings"] = max_positions;
    std::ofstream(dir + "/config.json") << config.dump();
  }
  return dir;
}

// A run refused as bad input: its flags and the message its error must hold.
struct Refused {
  std::vector<std::string> args;
  std::string message;
};

// Each case, run with -q, --json and --trace (files named after `name`), exits 2 with its
// message on stderr and leaves neither file behind.
void expect_refused_writing_nothing(const std::vector<Refused>& cases, const std::string& name) {
  const std::string json = temp_path(name + ".json"), trace = temp_path(name + ".trace.json");
  for (const Refused& c : cases) {
    fs::remove(json);
    fs::remove(trace);
    std::vector<std::string> args = {"generate", "-q", "--json", json, "--trace", trace};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const Outcome o = tspemu(args);
    EXPECT_EQ(o.code, 2) << c.message << "\n" << o.out << o.err;
    EXPECT_NE(o.err.find(c.message), std::string::npos) << o.err;
    EXPECT_FALSE(fs::exists(json)) << c.message;
    EXPECT_FALSE(fs::exists(trace)) << c.message;
  }
}

TEST(Generate, DefaultRunPassesAndWritesEveryField) {
  const std::string json = temp_path("default.json");
  fs::remove(json);
  const Outcome o = tspemu({"generate", "-q", "--json", json});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("time to first token"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("time per output token"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("verdict: PASS"), std::string::npos) << o.out;
  const nlohmann::json j = read_json(json);
  EXPECT_EQ(j.at("command"), "generate");
  EXPECT_EQ(j.at("config").at("prompt_lengths"), (std::vector<int>{7, 13, 5}));
  EXPECT_EQ(j.at("config").at("new_tokens"), 32);
  EXPECT_GT(j.at("ttft_seconds").get<double>(), 0);
  EXPECT_GT(j.at("tpot_seconds").get<double>(), 0);
  EXPECT_GT(j.at("tokens_per_s").get<double>(), 0);
  EXPECT_EQ(j.at("decode_step_seconds").size(), 31u);
  const auto ranks = j.at("config").at("ranks").get<std::size_t>();
  EXPECT_EQ(j.at("kv_cache").at("measured_bytes_per_rank").size(), ranks);
  EXPECT_EQ(j.at("kv_cache").at("measured_bytes_per_rank"),
            j.at("kv_cache").at("model_bytes_per_rank"));
  EXPECT_EQ(j.at("kv_cache").at("match"), true);
  ASSERT_EQ(j.at("tokens").size(), 3u);
  for (const auto& t : j.at("tokens")) EXPECT_EQ(t.size(), 32u);
  EXPECT_EQ(j.at("check").at("ran"), true);
  EXPECT_EQ(j.at("check").at("numerics_ok"), true);
  EXPECT_EQ(j.at("verdict"), "pass");
}

TEST(Generate, TheReferenceHoldsTheWholeCache) {
  const std::string json = temp_path("reference.json");
  const Outcome o = tspemu(
      {"generate", "-q", "--strategy", "reference", "--ranks", "1", "--json", json, "--no-check"});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  // 2·L·Σ S_b·NKV·hs·4 by hand, S_b = P_b + 31: L = 2, NKV = 4, hs = 256 / 8.
  const std::uint64_t whole = 2ull * 2 * (7 + 13 + 5 + 3 * 31) * 4 * 32 * 4;
  const nlohmann::json j = read_json(json);
  EXPECT_EQ(j.at("kv_cache").at("measured_bytes_per_rank"), (std::vector<std::uint64_t>{whole}));
  EXPECT_EQ(j.at("kv_cache").at("model_bytes_per_rank"), (std::vector<std::uint64_t>{whole}));
  EXPECT_EQ(j.at("check").at("ran"), false);
}

// SP (tsp/sp_decoder.hpp) on 3 ranks, a degree that divides neither the default model's heads
// nor its vocabulary: the run passes, each rank's KV bytes equal the closed form.
TEST(Generate, SpOnThreeRanksPassesWithTheKvCacheOfTheClosedForm) {
  const std::string json = temp_path("sp.json");
  const Outcome o = tspemu({"generate", "-q", "--strategy", "sp", "--ranks", "3", "--json", json});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  const nlohmann::json j = read_json(json);
  EXPECT_EQ(j.at("kv_cache").at("measured_bytes_per_rank").size(), 3u);
  EXPECT_EQ(j.at("kv_cache").at("match"), true);
  EXPECT_EQ(j.at("check").at("numerics_ok"), true);
  EXPECT_EQ(j.at("verdict"), "pass");
}

// The TP+SP mesh (tsp/mesh_decoder.hpp) on 8 ranks: T = 2 (the smallest divisor > 1 of 8 that
// divides the default model's heads, KV heads, MLP width and vocabulary), Σ = 4; the run passes
// and ranks 2·σ and 2·σ + 1 (one row) hold the same KV bytes. On 3 ranks no mesh exists: exit 2
// naming the flags, nothing written.
TEST(Generate, TpSpPicksTheSmallestTAndRefusesADegreeWithoutAMesh) {
  const std::string json = temp_path("tp_sp.json");
  const Outcome o =
      tspemu({"generate", "-q", "--strategy", "tp-sp", "--ranks", "8", "--json", json});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  const nlohmann::json j = read_json(json);
  const auto kv = j.at("kv_cache").at("measured_bytes_per_rank").get<std::vector<std::uint64_t>>();
  ASSERT_EQ(kv.size(), 8u);
  for (std::size_t r = 0; r < 8; r += 2) EXPECT_EQ(kv[r], kv[r + 1]) << "row " << r / 2;
  EXPECT_EQ(j.at("kv_cache").at("match"), true);
  EXPECT_EQ(j.at("verdict"), "pass");
  fs::remove(json);
  const Outcome bad =
      tspemu({"generate", "-q", "--strategy", "tp-sp", "--ranks", "3", "--json", json});
  EXPECT_EQ(bad.code, 2) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("--strategy tp-sp --ranks 3: TP+SP decode: no T in (1, 3)"),
            std::string::npos)
      << bad.err;
  EXPECT_FALSE(fs::exists(json));
}

// SP with a ring pass-KV or Ulysses prefill (tsp/sp_decoder.hpp) and Megatron-SP
// (tsp/megatron_sp_decoder.hpp): each passes with the KV cache and the decode traffic of its
// closed forms. On 3 ranks, Ulysses (3 divides neither NH=8 nor NKV=4) and Megatron-SP (TP's
// T | NH) exit 2 naming the flags and the rule, nothing written; the ring runs.
TEST(Generate, SpPrefillVariantsAndMegatronSpPassOrRefuseNamingTheRule) {
  const std::string json = temp_path("sp_variants.json");
  for (const char* strategy : {"sp-ring", "sp-ulysses", "megatron-sp"}) {
    fs::remove(json);
    const Outcome o =
        tspemu({"generate", "-q", "--strategy", strategy, "--ranks", "4", "--json", json});
    ASSERT_EQ(o.code, 0) << strategy << o.out << o.err;
    const nlohmann::json j = read_json(json);
    EXPECT_EQ(j.at("kv_cache").at("measured_bytes_per_rank").size(), 4u) << strategy;
    EXPECT_EQ(j.at("kv_cache").at("match"), true) << strategy;
    EXPECT_EQ(j.at("decode_traffic_match"), true) << strategy;
    EXPECT_EQ(j.at("verdict"), "pass") << strategy;
  }
  fs::remove(json);
  const Outcome ring =
      tspemu({"generate", "-q", "--strategy", "sp-ring", "--ranks", "3", "--json", json});
  EXPECT_EQ(ring.code, 0) << ring.out << ring.err;
  for (const auto& [strategy, why] :
       {std::pair<std::string, std::string>{"sp-ulysses", "Ulysses prefill needs"},
        {"megatron-sp", "Megatron-SP decode (TP's rules)"}}) {
    fs::remove(json);
    const Outcome bad =
        tspemu({"generate", "-q", "--strategy", strategy, "--ranks", "3", "--json", json});
    EXPECT_EQ(bad.code, 2) << bad.out << bad.err;
    EXPECT_NE(bad.err.find("--strategy " + strategy + " --ranks 3: "), std::string::npos)
        << bad.err;
    EXPECT_NE(bad.err.find(why), std::string::npos) << bad.err;
    EXPECT_FALSE(fs::exists(json)) << strategy;
  }
}

TEST(Generate, BadInputExitsTwoNamingTheFlagAndWritesNothing) {
  expect_refused_writing_nothing(
      {
          {{"--prompt-lengths", "7,0,5"}, "--prompt-lengths 7,0,5: sequence 1 has an empty prompt"},
          {{"--prompt-lengths", "7,,5"}, "--prompt-lengths 7,,5: give comma-separated"},
          {{"--prompt-lengths", "3000"},
           "--prompt-lengths 3000: the prompt of sequence 0 has 3000 tokens, longer than the "
           "model's context of 2048"},
          {{"--max-context", "16", "--prompt-lengths", "4,17"},
           "the prompt of sequence 1 has 17 tokens, longer than the model's context of 16"},
          {{"--new-tokens", "0"}, "--new-tokens 0: must be >= 1"},
          {{"--max-context", "40", "--new-tokens", "28"},
           "--new-tokens 28: sequence 1 would hold 13 + 28 tokens, beyond the model's context of "
           "40"},
          {{"--strategy", "reference", "--ranks", "2"},
           "--strategy reference --ranks 2: the reference decoder runs on exactly 1 rank"},
          {{"--strategy", "nonesuch"}, "--strategy: nonesuch not in"},
          {{"--ranks", "0"},
           "--ranks 0: must be >= 1 (an integer in [1, 256]; a world has 1 to 256 ranks)"},
          {{"--interleave", "0"}, "--interleave 0: must be >= 1"},
          {{"--prompt", "hi", "--vocab", "100"},
           "--prompt hi: byte 0 is token 104, outside the vocabulary of 100"},
          {{"--prompt", ""}, "--prompt '': must not be empty"},
          {{"--temperature", "0.5"}, "--temperature needs --sampling seeded"},
          {{"--sampling", "seeded", "--temperature", "0"}, "--temperature 0: must be > 0"},
          {{"--sampling", "seeded", "--top-k", "-1"}, "--top-k -1: must be >= 0"},
      },
      "bad");
}

// A prompt far longer than the context is refused from its length alone, before its tokens are
// drawn: with the address space capped at 512 MiB above what the process maps, the 4 GiB of a
// 2^30-token prompt could not even be allocated.
TEST(Generate, APromptFarPastTheContextIsRefusedBeforeItsTokensAreDrawn) {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t pages = 0;
  ASSERT_TRUE(statm >> pages);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &old), 0);
  rlimit capped = old;
  const std::uint64_t cap =
      pages * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE)) + (512u << 20);
  if (old.rlim_cur == RLIM_INFINITY || cap < old.rlim_cur) capped.rlim_cur = cap;
  ASSERT_EQ(setrlimit(RLIMIT_AS, &capped), 0);
  const Outcome o = tspemu({"generate", "-q", "--prompt-lengths", "5,1073741824"});
  ASSERT_EQ(setrlimit(RLIMIT_AS, &old), 0);
  EXPECT_EQ(o.code, 2) << o.out << o.err;
  EXPECT_NE(o.err.find("--prompt-lengths 5,1073741824: the prompt of sequence 1 has 1073741824 "
                       "tokens, longer than the model's context of 2048"),
            std::string::npos)
      << o.err;
}

// A degree D past what a strategy can shard the default model over (NH = 8 query heads: D = 16
// leaves a rank without one), or past the largest world: exit 2 naming the strategy, the degree
// and the rule, nothing written.
TEST(Generate, ADegreeLargerThanTheScheduleAllowsExitsTwoNamingItAndWritesNothing) {
  expect_refused_writing_nothing(
      {
          {{"--ranks", "16"},
           "--strategy tsp-w --ranks 16: TSP-W decode: D=16 does not divide NH=8 (each rank owns "
           "NH/D query heads)"},
          {{"--strategy", "tsp-m", "--ranks", "16"},
           "--strategy tsp-m --ranks 16: TSP-M decode: D=16 does not divide NH=8"},
          {{"--strategy", "tp", "--ranks", "16"},
           "--strategy tp --ranks 16: TP decode: T=16 does not divide NH=8"},
          {{"--strategy", "helix", "--ranks", "16"},
           "--strategy helix --ranks 16: Helix decode: N=16 does not divide NH=8"},
          {{"--ranks", "257"}, "--ranks 257: must be at most 256"},
      },
      "degree");
}

// A checkpoint (--weights) whose vocabulary does not hold a byte of the prompt, or whose context
// (max_position_embeddings) the prompt outgrows: exit 2 naming the flag, the values and the
// checkpoint, with no --json or --trace file written.
TEST(Generate, ACheckpointThatCannotHoldThePromptExitsTwoAndWritesNothing) {
  const std::string dir = small_checkpoint("v100_ctx8", 100, 8);
  expect_refused_writing_nothing(
      {
          {{"--weights", dir, "--prompt", "az"},
           "--prompt az: byte 1 is token 122, outside the vocabulary of 100 of --weights " + dir},
          {{"--weights", dir, "--prompt", "ABCDEFGHI"},
           "--prompt: the prompt of sequence 0 has 9 tokens, longer than the model's context of 8 "
           "positions (max_position_embeddings of --weights " +
               dir + ")"},
      },
      "checkpoint");
}

// A checkpoint's vocabulary must hold a byte-level prompt, and its max_position_embeddings is the
// context.
TEST(Generate, CheckpointVocabularyAndContextBoundThePrompt) {
  const std::string small = small_checkpoint("v100", 100);
  Outcome o = tspemu({"generate", "-q", "--weights", small, "--prompt", "é"});
  EXPECT_EQ(o.code, 2) << o.out << o.err;
  EXPECT_NE(o.err.find("byte 0 is token 195, outside the vocabulary of 100 of --weights " + small),
            std::string::npos)
      << o.err;
  o = tspemu({"generate", "-q", "--weights", small, "--prompt", "abc", "-N", "4"});
  EXPECT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("weights: the checkpoint in " + small), std::string::npos) << o.out;

  const std::string bytes = small_checkpoint("v256", 256, 8);
  o = tspemu({"generate", "-q", "--weights", bytes, "--prompt", "four", "-N", "5"});
  EXPECT_EQ(o.code, 2) << o.out << o.err;
  EXPECT_NE(o.err.find("--new-tokens 5: sequence 0 would hold 4 + 5 tokens, beyond the model's "
                       "context of 8 positions (max_position_embeddings of --weights"),
            std::string::npos)
      << o.err;
  o = tspemu({"generate", "-q", "--weights", bytes, "--prompt", "four", "-N", "4"});
  EXPECT_EQ(o.code, 0) << o.out << o.err;
}

TEST(Generate, GreedyRunsRepeatTheirTokens) {
  const std::vector<std::string> args = {"-N", "12", "--prompt-lengths", "5,9"};
  const auto a = tokens_of(args, "a.json"), b = tokens_of(args, "b.json");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a, b);
}

TEST(Generate, SeededSamplingRepeatsBySeed) {
  auto run = [](const char* seed, const char* mode, const std::string& name) {
    return tokens_of({"-N", "12", "--prompt-lengths", "5,9", "--seed", seed, "--sampling", mode,
                      "--temperature", "1.5"},
                     name);
  };
  // greedy refuses --temperature, so greedy runs without it.
  const auto greedy = tokens_of({"-N", "12", "--prompt-lengths", "5,9", "--seed", "3"}, "g.json");
  const auto s3 = run("3", "seeded", "s3.json"), again = run("3", "seeded", "s3b.json");
  const auto s4 = run("4", "seeded", "s4.json");
  EXPECT_EQ(s3, again);
  EXPECT_NE(s3, greedy);  // same weights and prompts: only the sampler differs
  EXPECT_NE(s3, s4);
}

TEST(Generate, TraceHoldsThePrefillAndEveryDecodeStep) {
  const std::string trace = temp_path("trace.json");
  fs::remove(trace);
  const Outcome o = tspemu({"generate", "-q", "-N", "6", "--trace", trace});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  const nlohmann::json t = read_json(trace);
  const nlohmann::json& events = t.is_object() ? t.at("traceEvents") : t;
  std::map<int, std::pair<int, int>> per_rank;  // pid: prefill and decode step spans
  for (const auto& e : events) {
    if (!e.contains("name") || e.value("ph", "") != "X") continue;
    auto& [prefill, steps] = per_rank[e.at("pid").get<int>()];
    prefill += e.at("name") == "prefill";
    steps += e.at("name") == "decode step";
  }
  ASSERT_FALSE(per_rank.empty());
  for (const auto& [rank, spans] : per_rank) {
    EXPECT_EQ(spans.first, 1) << "rank " << rank;
    EXPECT_EQ(spans.second, 5) << "rank " << rank;
  }
}

// A pick that differs from the oracle's is a near-tie exactly when logits within e of the oracle's
// row reach it; the thresholds below are worked by hand.
TEST(Generate, DivergenceIsANearTieExactlyWithinTheRowsBound) {
  const SamplingOptions greedy;
  const std::vector<double> close = {0, 1.0, 0.9999};  // top-1 minus token 2's logit: 1e-4 = 2e
  EXPECT_TRUE(within_rounding(close, 2, 1, 0.51e-4, greedy, 0));
  EXPECT_FALSE(within_rounding(close, 2, 1, 0.49e-4, greedy, 0));
  // Seeded, two equal weights: u = 0.49 picks token 0. Token 1 needs α·1 <= u·(α + γ) with
  // α = 1/g, γ = g: g² >= 1/u - 1, e >= ln(g) = 0.0199990.
  const SamplingOptions seeded{.greedy = false, .temperature = 1.0};
  const std::vector<double> even = {0, 0};
  EXPECT_TRUE(within_rounding(even, 1, 0, 0.02001, seeded, 0.49));
  EXPECT_FALSE(within_rounding(even, 1, 0, 0.01999, seeded, 0.49));
  // u = 0.6 picks token 1; token 0 needs γ·1 > u·(γ + δ) with γ = g, δ = 1/g: g² > u / (1 - u),
  // e > ln(1.5) / 2 = 0.2027; a temperature of 2 halves what a logit error does.
  EXPECT_TRUE(within_rounding(even, 0, 1, 0.2028, seeded, 0.6));
  EXPECT_FALSE(within_rounding(even, 0, 1, 0.2026, seeded, 0.6));
  const SamplingOptions hot{.greedy = false, .temperature = 2.0};
  EXPECT_FALSE(within_rounding(even, 0, 1, 0.3, hot, 0.6));
  EXPECT_TRUE(within_rounding(even, 0, 1, 0.406, hot, 0.6));
  // Top-2 of {3, 2, 1, 0}: token 2 is outside the set, 1 below the 2nd logit.
  const SamplingOptions top2{.greedy = false, .temperature = 1.0, .top_k = 2};
  const std::vector<double> ranked = {3, 2, 1, 0};
  EXPECT_TRUE(within_rounding(ranked, 2, 0, 0.51, top2, 0.5));
  EXPECT_FALSE(within_rounding(ranked, 2, 0, 0.49, top2, 0.5));
}

// A stand-in parallel strategy: every rank runs the reference decoder (a replicated cache); rank
// `bad_rank` (-2: every rank) adds 10 to token 0's logit from step `bad_step` on, as a schedule
// whose ranks disagree (or that is wrong on every rank) would.
class ReplicatedSession final : public DecodeSession {
 public:
  ReplicatedSession(const ref::ModelWeights<float>& w, bool bad, int bad_step)
      : w_(w), bad_(bad), bad_step_(bad_step) {}
  std::vector<float> prefill(const std::vector<std::vector<std::int32_t>>& prompts) override {
    ref::Prefill<float> p = ref::prefill(w_, prompts);
    cache_ = std::move(p.cache);
    return corrupt(std::move(p.logits));
  }
  std::vector<float> decode_step(std::span<const std::int32_t> tokens) override {
    return corrupt(ref::decode_step(w_, cache_, tokens));
  }
  std::uint64_t kv_cache_bytes() const override { return cache_.bytes(); }

 private:
  std::vector<float> corrupt(std::vector<float> logits) {
    if (bad_ && step_++ >= bad_step_) logits[0] += 10;
    return logits;
  }
  const ref::ModelWeights<float>& w_;
  bool bad_;
  int bad_step_, step_ = 0;
  ref::KvCache<float> cache_;
};

DecodeStrategy replicated(int bad_rank, int bad_step) {
  return DecodeStrategy{
      .name = "replicated",
      .description = "test",
      .why_invalid = [](const GenerateShape&) { return std::string(); },
      .make = [=](Rank& rank, const GenerateShape&,
                  const ref::ModelWeights<float>& w) -> std::unique_ptr<DecodeSession> {
        return std::make_unique<ReplicatedSession>(w, rank.id() == bad_rank || bad_rank == -2,
                                                   bad_step);
      },
      .kv_cache_bytes =
          [](const GenerateShape& s, std::span<const std::int64_t> prompt_lengths, int new_tokens,
             int) {
            std::uint64_t positions = 0;
            for (const std::int64_t n : prompt_lengths)
              positions += static_cast<std::uint64_t>(n + new_tokens - 1);
            return 2 * static_cast<std::uint64_t>(s.model.n_layers) * positions *
                   static_cast<std::uint64_t>(s.model.kv_dim()) * sizeof(float);
          },
      .kv_formula = "the whole cache on every rank",
  };
}

GenerateConfig replicated_config(const DecodeStrategy& st) {
  GenerateConfig c;
  c.strategy = &st;
  c.shape.model = ref::ModelConfig{
      .vocab = 64, .hidden = 32, .n_layers = 1, .n_heads = 4, .n_kv_heads = 2, .ffn = 48};
  c.shape.ranks = 3;
  c.shape.batch = 2;
  c.weights =
      std::make_shared<const ref::ModelWeights<float>>(ref::init_weights<float>(c.shape.model, 7));
  c.prompts = {{1, 2, 3}, {4, 5, 6, 7, 8}};
  c.new_tokens = 6;
  return c;
}

// A parallel strategy's run is checked against the fp32 reference decoder as well as the oracle.
TEST(Generate, AParallelStrategyIsCheckedAgainstTheReferenceDecoder) {
  const DecodeStrategy st = replicated(-1, 0);
  const GenerateResult r = run_generate(replicated_config(st));
  EXPECT_TRUE(r.pass());
  EXPECT_TRUE(r.checked);
  EXPECT_TRUE(r.tokens_match_reference);
  EXPECT_EQ(r.step_logits.size(), 6u);
  EXPECT_EQ(r.kv_bytes, r.kv_model);
  EXPECT_EQ(r.kv_bytes.size(), 3u);
}

// Ranks that would pick different tokens stop the run, naming the rank and the step.
TEST(Generate, RanksThatDisagreeFailNamingTheRankAndStep) {
  const DecodeStrategy st = replicated(2, 3);
  try {
    run_generate(replicated_config(st));
    FAIL() << "the run did not fail";
  } catch (const std::exception& e) {
    EXPECT_NE(
        std::string(e.what()).find("the ranks disagree at step 3 (decode step): rank 2 picks"),
        std::string::npos)
        << e.what();
  }
}

// Wrong logits on every rank agree, and fail the rule and the oracle's picks from that step on.
TEST(Generate, WrongLogitsOnEveryRankFailTheCheckAtTheirStep) {
  const DecodeStrategy st = replicated(-2, 3);
  const GenerateResult r = run_generate(replicated_config(st));
  EXPECT_FALSE(r.pass());
  EXPECT_FALSE(r.numerics_ok);
  ASSERT_EQ(r.step_logits.size(), 6u);
  EXPECT_TRUE(r.step_logits[2].ok());
  EXPECT_FALSE(r.step_logits[3].ok());
  ASSERT_FALSE(r.divergences.empty());
  EXPECT_EQ(r.divergences.front().step, 3);
  EXPECT_EQ(r.divergences.front().who, "replicated");
  EXPECT_FALSE(r.divergences_explained());
}

// A strategy's stated decode-step traffic is held to every rank's measured counts: the replicated
// stand-in runs no collective, so an empty closed form matches and one all-reduce fails the run.
TEST(Generate, DecodeTrafficIsHeldToTheStrategysClosedFormOnEveryRank) {
  DecodeStrategy st = replicated(-1, 0);
  st.decode_traffic = [](const GenerateShape&, std::span<const std::int64_t>, int, int) {
    return TrafficCounters{};
  };
  const GenerateResult none = run_generate(replicated_config(st));
  EXPECT_TRUE(none.traffic_match);
  EXPECT_TRUE(none.pass());
  st.decode_traffic = [](const GenerateShape&, std::span<const std::int64_t>, int, int) {
    TrafficCounters t;
    t.add(CollectiveKind::all_reduce, 1, 8, 8);
    return t;
  };
  const GenerateResult wrong = run_generate(replicated_config(st));
  EXPECT_EQ(wrong.decode_model.size(), 3u);
  EXPECT_FALSE(wrong.traffic_match);
  EXPECT_FALSE(wrong.pass());
}

}  // namespace
}  // namespace tspemu::app
