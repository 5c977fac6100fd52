// The Eagle3 drafter on the CPU: the head format (load, errors, make-model round trip), the
// draft step against a naive re-computation from the weights, the head's rollback and restarts
// (the CUDA test's script of commits, rewinds and late restarts against a fresh head), and the
// engine with method eagle3 over the exact CPU backend on the tiny fixture: greedy output equal
// to plain decoding with a random head (acceptance ~0) and with a hand-made head whose drafts
// are often right (acceptance > 0), seeded sampling unchanged, no KV page leaks.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "engine_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "common/error.h"
#include "engine/eagle3_drafter.h"
#include "engine/engine.h"
#include "engine/speculative.h"
#include "model/eagle3_weights.h"
#include "model/weights.h"

using namespace gptoss;
namespace fs = std::filesystem;

namespace {

const std::string kFixture = std::string(GPTOSS_TEST_DATA) + "/tiny-gptoss";

std::shared_ptr<const ModelWeights> target() {
  static auto w = ModelWeights::load(kFixture);
  return w;
}

Backend& backend() {
  static auto be = make_cpu_backend(target(), 2);
  return *be;
}

// A head for the fixture (hidden 64, 2 layers, vocab 512): draft vocabulary 128, d2t stride 4.
Eagle3Config head_config() {
  Eagle3Config c = Eagle3Config::preset("eagle3-tiny");
  c.hidden = c.target_hidden = 64;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.intermediate = 96;
  c.vocab = 512;
  c.draft_vocab = 128;
  c.aux_layers = {0, 1, 1};
  return c;
}

std::string temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("gptoss-eagle3-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(d);
  return d.string();
}

std::string random_head(const std::string& name, bool with_embed = false, uint64_t seed = 1) {
  static std::map<std::string, std::string> made;
  const std::string key = name + (with_embed ? "+e" : "") + std::to_string(seed);
  if (made.count(key)) return made[key];
  std::string d = temp_dir(key);
  make_random_eagle3(head_config(), d, seed, with_embed);
  return made[key] = d;
}

// Copies a head's tensors into a new directory, letting `edit` change a tensor (return false to
// drop it), and writes `config` as its config.json.
std::string edited_head(const std::string& src, const std::string& name,
                        const std::function<bool(TensorSpec&, std::vector<uint8_t>&)>& edit,
                        const nlohmann::json* config = nullptr) {
  Checkpoint ck(src);
  std::vector<TensorSpec> specs;
  std::vector<std::vector<uint8_t>> data;
  for (const auto& n : ck.names()) {
    const TensorView& t = ck.get(n);
    TensorSpec s{n, t.dtype, t.shape};
    std::vector<uint8_t> bytes(t.data, t.data + t.nbytes);
    if (!edit(s, bytes)) continue;
    bytes.resize(s.nbytes());
    specs.push_back(s);
    data.push_back(std::move(bytes));
  }
  std::string d = temp_dir(name);
  fs::create_directories(d);
  write_safetensors(d + "/model.safetensors", specs, [&](const TensorSpec& s, uint8_t* out) {
    for (size_t i = 0; i < specs.size(); ++i)
      if (specs[i].name == s.name) std::memcpy(out, data[i].data(), data[i].size());
  });
  if (config) std::ofstream(d + "/config.json") << config->dump(2);
  else fs::copy_file(src + "/config.json", d + "/config.json");
  return d;
}

std::string load_error(const std::string& dir) {
  try {
    auto w = Eagle3Weights::load(dir);
    Eagle3Drafter dr(w, target()->config, nullptr);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

float f32(const TensorView* t, size_t i) { return tensor_float_at(*t, int64_t(i)); }

// The draft step written out naively from the weights, in double, recomputing every row from
// scratch: rows[i] = (token after position i, hidden input of row i); returns the pre-norm
// output of the last row and the draft logits after it.
struct Naive {
  const Eagle3Weights& w;
  const TensorView* embed;
  std::vector<double> rms(const std::vector<double>& x, const TensorView* g) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / x.size() + w.config.rms_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * f32(g, i);
    return y;
  }
  std::vector<double> mat(const TensorView* W, const std::vector<double>& x) const {
    const size_t out = size_t(W->shape[0]), in = size_t(W->shape[1]);
    std::vector<double> y(out, 0.0);
    for (size_t o = 0; o < out; ++o)
      for (size_t i = 0; i < in; ++i) y[o] += f32(W, o * in + i) * x[i];
    return y;
  }
  void rope(std::vector<double>& x, int heads, int pos) const {
    const int D = w.config.head_dim;
    for (int h = 0; h < heads; ++h)
      for (int j = 0; j < D / 2; ++j) {
        const double f = std::pow(w.config.rope_theta, -2.0 * j / D) * pos;
        double& a = x[size_t(h) * D + j];
        double& b = x[size_t(h) * D + j + D / 2];
        const double na = a * std::cos(f) - b * std::sin(f), nb = b * std::cos(f) + a * std::sin(f);
        a = na;
        b = nb;
      }
  }
  // Runs rows 0..n-1 (positions 0..n-1); hidden inputs of chained rows come from `feed`.
  std::vector<std::vector<double>> run(const std::vector<int32_t>& toks, std::vector<std::vector<double>> h) const {
    const auto& c = w.config;
    const int H = c.hidden, D = c.head_dim, group = c.num_heads / c.num_kv_heads;
    std::vector<std::vector<double>> K, V, outs;
    for (size_t r = 0; r < toks.size(); ++r) {
      std::vector<double> e(H);
      for (int j = 0; j < H; ++j) e[j] = f32(embed, size_t(toks[r]) * H + j);
      auto en = rms(e, w.input_norm), hn = rms(h[r], w.hidden_norm);
      std::vector<double> cat(en);
      cat.insert(cat.end(), hn.begin(), hn.end());
      auto q = mat(w.q, cat), k = mat(w.k, cat), v = mat(w.v, cat);
      rope(q, c.num_heads, int(r));
      rope(k, c.num_kv_heads, int(r));
      K.push_back(k);
      V.push_back(v);
      std::vector<double> a(size_t(c.num_heads) * D, 0.0);
      for (int hh = 0; hh < c.num_heads; ++hh) {
        const int kh = hh / group;
        std::vector<double> s(r + 1);
        double m = -1e300, den = 0;
        for (size_t j = 0; j <= r; ++j) {
          double d = 0;
          for (int x = 0; x < D; ++x) d += q[size_t(hh) * D + x] * K[j][size_t(kh) * D + x];
          s[j] = d / std::sqrt(double(D));
          m = std::max(m, s[j]);
        }
        for (auto& x : s) den += (x = std::exp(x - m));
        for (size_t j = 0; j <= r; ++j)
          for (int x = 0; x < D; ++x) a[size_t(hh) * D + x] += s[j] / den * V[j][size_t(kh) * D + x];
      }
      auto o = mat(w.o, a);
      std::vector<double> resid(H);
      for (int j = 0; j < H; ++j) resid[j] = h[r][j] + o[j];
      auto n = rms(resid, w.post_norm);
      auto g = mat(w.gate, n), u = mat(w.up, n);
      for (size_t j = 0; j < g.size(); ++j) g[j] = g[j] / (1 + std::exp(-g[j])) * u[j];
      auto d = mat(w.down, g);
      for (int j = 0; j < H; ++j) d[j] += resid[j];
      outs.push_back(d);
    }
    return outs;
  }
  std::vector<double> logits(const std::vector<double>& prenorm) const { return mat(w.lm_head, rms(prenorm, w.norm)); }
};

std::vector<float> random_taps(int n, int width, uint64_t seed) {
  std::vector<float> t(size_t(n) * width);
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& x : t) x = d(g);
  return t;
}

}  // namespace

TEST(Eagle3Format, MakeModelRoundTrip) {
  const std::string d = random_head("roundtrip", true);
  auto w = Eagle3Weights::load(d);
  const Eagle3Config c = head_config();
  EXPECT_EQ(w->config.hidden, c.hidden);
  EXPECT_EQ(w->config.draft_vocab, c.draft_vocab);
  EXPECT_EQ(w->config.aux_layers, c.aux_layers);
  EXPECT_EQ(w->config.tap_layers(2), (std::vector<int>{0, 1, 1}));
  ASSERT_NE(w->embed, nullptr);
  EXPECT_EQ(w->fc->shape, (std::vector<int64_t>{64, 192}));
  EXPECT_EQ(w->q->shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(w->k->shape, (std::vector<int64_t>{32, 128}));
  EXPECT_EQ(w->lm_head->shape, (std::vector<int64_t>{128, 64}));
  ASSERT_EQ(int(w->draft_to_target.size()), 128);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(w->draft_to_target[i], 4 * i);
  const TensorView& t2d = w->checkpoint->get("t2d");
  EXPECT_EQ(t2d.dtype, DType::BOOL);
  EXPECT_EQ(t2d.data[4], 1);
  EXPECT_EQ(t2d.data[5], 0);
  // the same seed gives the same bytes; the presets have the published shapes
  EXPECT_EQ(Eagle3Config::preset("eagle3-120b").aux_layers, (std::vector<int>{1, 17, 33}));
  EXPECT_EQ(Eagle3Config::preset("eagle3-20b").tap_layers(24), (std::vector<int>{1, 11, 20}));
  Eagle3Config dflt = Eagle3Config::preset("eagle3-120b");
  dflt.aux_layers.clear();
  EXPECT_EQ(dflt.tap_layers(36), (std::vector<int>{1, 17, 32}));  // SGLang's capture of layers 2, L/2, L-3 inputs
  EXPECT_THROW(Eagle3Config::preset("eagle3-7b"), Error);
  // to_json -> from_json keeps every field
  const Eagle3Config back = Eagle3Config::from_json(c.to_json(), "x");
  EXPECT_EQ(back.to_json(), c.to_json());
}

TEST(Eagle3Format, LoadErrorsNameTheProblem) {
  const std::string good = random_head("errors");
  EXPECT_NE(load_error(good).find("no embed_tokens.weight"), std::string::npos);  // and no target embedding given
  EXPECT_NE(load_error("/nonexistent/head").find("not an Eagle3 head directory"), std::string::npos);
  auto drop = [&](const std::string& name) {
    return edited_head(good, "drop-" + name, [&](TensorSpec& s, std::vector<uint8_t>&) { return s.name != name; });
  };
  EXPECT_NE(load_error(drop("fc.weight")).find("tensor fc.weight is missing"), std::string::npos);
  EXPECT_NE(load_error(drop("midlayer.hidden_norm.weight")).find("midlayer.hidden_norm.weight"), std::string::npos);
  const std::string bad_shape = edited_head(good, "shape", [](TensorSpec& s, std::vector<uint8_t>&) {
    if (s.name == "midlayer.self_attn.q_proj.weight") s.shape = {64, 64};
    return true;
  });
  EXPECT_NE(load_error(bad_shape).find("has shape [64, 64], expected [64, 128]"), std::string::npos);
  const std::string bad_d2t = edited_head(good, "d2t", [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "d2t") {
      const int64_t off = 1000;
      std::memcpy(b.data() + 8 * 5, &off, 8);
    }
    return true;
  });
  EXPECT_NE(load_error(bad_d2t).find("d2t maps draft id 5 to target id 1005"), std::string::npos);
  EXPECT_NE(load_error(drop("d2t")).find("no d2t tensor"), std::string::npos);
  nlohmann::json cfg = head_config().to_json();
  cfg["architectures"] = {"LlamaForCausalLM"};
  EXPECT_NE(load_error(edited_head(good, "arch", [](TensorSpec&, std::vector<uint8_t>&) { return true; }, &cfg))
                .find("not an Eagle3 head"),
            std::string::npos);
  cfg = head_config().to_json();
  cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {0, 1, 5};
  const std::string far = edited_head(good, "aux", [](TensorSpec&, std::vector<uint8_t>&) { return true; }, &cfg);
  EXPECT_NE(load_error(far).find("auxiliary layer id 5 is outside the target's 2 layers"), std::string::npos);
  cfg = head_config().to_json();
  cfg["target_hidden_size"] = 128;
  const std::string wide = edited_head(good, "th", [](TensorSpec& s, std::vector<uint8_t>&) {
    if (s.name == "fc.weight") s.shape = {64, 384};
    return true;
  }, &cfg);
  EXPECT_NE(load_error(wide).find("target hidden size of 128"), std::string::npos);
  // a head sharing the target's embedding loads with it
  auto w = Eagle3Weights::load(good);
  EXPECT_NO_THROW(Eagle3Drafter(w, target()->config, target()->embed));
}

TEST(Eagle3Format, SpeculativeConfig) {
  auto c = parse_speculative_config(R"({"method":"eagle3","model":"/x/head","num_speculative_tokens":2})");
  EXPECT_EQ(c.method, "eagle3");
  EXPECT_EQ(c.model, "/x/head");
  EXPECT_EQ(c.num_speculative_tokens, 2);
  auto msg = [](const std::string& j) {
    try {
      parse_speculative_config(j);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg(R"({"method":"eagle3","num_speculative_tokens":1})").find("needs \"model\""), std::string::npos);
  EXPECT_NE(msg(R"({"method":"ngram","model":"/x","num_speculative_tokens":1})").find("only for method \"eagle3\""),
            std::string::npos);
  EXPECT_NE(msg(R"({"method":"eagle3","model":"/x","num_speculative_tokens":1,"prompt_lookup_max":2})")
                .find("only for method \"ngram\""),
            std::string::npos);
  // the engine loads the head when it starts
  EngineConfig ec;
  ec.max_model_len = 64;
  ec.speculative = parse_speculative_config(R"({"method":"eagle3","model":"/nonexistent","num_speculative_tokens":1})");
  EXPECT_THROW(Engine(backend(), ec), Error);
}

// The draft step against the naive re-computation: committed rows (target taps through fc),
// then K = 3 chained rows fed by the head's own pre-norm output; logits and ids agree.
TEST(Eagle3Drafter, MatchesNaiveReference) {
  auto w = Eagle3Weights::load(random_head("naive"));
  Eagle3Drafter dr(w, target()->config, target()->embed);
  const int n = 7;
  const std::vector<int32_t> next = {5, 17, 300, 2, 2, 499, 64};
  const auto taps = random_taps(n, dr.tap_width(), 3);
  Eagle3Drafter::State s;
  dr.commit(s, 0, n, next.data(), taps.data());
  std::vector<float> lg;
  const auto drafts = dr.propose(s, 3, &lg);
  ASSERT_EQ(drafts.size(), 3u);

  Naive ref{*w, target()->embed};
  std::vector<std::vector<double>> h;
  for (int r = 0; r < n; ++r) {  // fc over the taps
    std::vector<double> t(taps.begin() + size_t(r) * dr.tap_width(), taps.begin() + size_t(r + 1) * dr.tap_width());
    h.push_back(ref.mat(w->fc, t));
  }
  std::vector<int32_t> toks = next;
  const int V = w->config.draft_vocab;
  for (int j = 0; j < 3; ++j) {
    auto outs = ref.run(toks, h);
    auto logits = ref.logits(outs.back());
    int best = 0;
    for (int i = 0; i < V; ++i) {
      EXPECT_NEAR(lg[size_t(j) * V + i], logits[i], 2e-4 * (1 + std::abs(logits[i]))) << "step " << j << " id " << i;
      if (logits[i] > logits[best]) best = i;
    }
    EXPECT_EQ(drafts[j], w->draft_to_target[best]) << "step " << j;
    toks.push_back(drafts[j]);  // the chained row: the draft token and the last pre-norm output
    h.push_back(outs.back());
  }
}

// Rollback: proposing (scratch rows), committing more rows, rewinding to recompute rows, all
// give what a fresh head fed the final history at once gives.
TEST(Eagle3Drafter, RollbackMatchesFreshHead) {
  auto w = Eagle3Weights::load(random_head("rollback"));
  Eagle3Drafter dr(w, target()->config, target()->embed);
  const int n = 12, width = dr.tap_width();
  std::vector<int32_t> next;
  for (int i = 0; i < n; ++i) next.push_back((i * 37 + 11) % 512);
  const auto taps = random_taps(n, width, 9);
  Eagle3Drafter::State fresh, s;
  dr.commit(fresh, 0, n, next.data(), taps.data());
  std::vector<float> want, got;
  const auto want_ids = dr.propose(fresh, 3, &want);

  dr.commit(s, 0, 5, next.data(), taps.data());
  dr.propose(s, 4);                                          // scratch rows at 5..7
  dr.commit(s, 5, 4, next.data() + 5, taps.data() + 5 * width);  // replaces them
  dr.propose(s, 2);
  dr.commit(s, 7, 5, next.data() + 7, taps.data() + 7 * width);  // rewinds rows 7, 8
  EXPECT_EQ(s.rows, n);
  const auto ids = dr.propose(s, 3, &got);
  EXPECT_EQ(ids, want_ids);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4f * (1 + std::abs(want[i]))) << i;
  // a gap (positions the head never saw) restarts the cache there
  dr.commit(s, 20, 2, next.data(), taps.data());
  EXPECT_EQ(s.first_pos, 20);
  EXPECT_EQ(s.rows, 2);
  // nothing committed: no drafts
  Eagle3Drafter::State empty;
  EXPECT_TRUE(dr.propose(empty, 3).empty());
}

// A head restarted at a late position (a prefix-cache hit: positions it never saw) attends to
// its own rows from there on only: the same rows committed at position 0 give the same logits
// (RoPE scores depend on relative positions alone).
TEST(Eagle3Drafter, LateStartSeesOnlyItsOwnRows) {
  auto w = Eagle3Weights::load(random_head("late"));
  Eagle3Drafter dr(w, target()->config, target()->embed);
  const int n = 9, width = dr.tap_width();
  std::vector<int32_t> next;
  for (int i = 0; i < n; ++i) next.push_back((i * 53 + 7) % 512);
  const auto taps = random_taps(n, width, 21);
  Eagle3Drafter::State at0, late;
  dr.commit(at0, 0, n, next.data(), taps.data());
  dr.commit(late, 600, n, next.data(), taps.data());
  EXPECT_EQ(late.first_pos, 600);
  std::vector<float> want, got;
  const auto want_ids = dr.propose(at0, 3, &want);
  const auto ids = dr.propose(late, 3, &got);
  EXPECT_EQ(ids, want_ids);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4f * (1 + std::abs(want[i]))) << i;
}

// The script the CUDA test (tests/cuda/test_cuda_eagle3.cpp, DeviceHeadMatchesHostHead) runs the
// device head against this one with, on the host head alone: two interleaved sequences, prompts
// of 37 and 337 rows, proposals of 1..4 tokens and commits of 1..4 rows, a row rewound now and
// then, and restarts 5 positions past the committed end (steps 40/41 and 90/91); plain RoPE
// with the head's own embedding, then YaRN, norm_before_residual and the target's embedding.
// Every proposal's logits are finite and equal what a fresh head fed the sequence's rows since
// its (re)start at position 0 gives (RoPE: only relative positions count).
TEST(Eagle3Drafter, ScriptedCommitsRewindsAndRestartsMatchAFreshHead) {
  const GptOssConfig& t = target()->config;
  for (int variant = 0; variant < 2; ++variant) {
    Eagle3Config hc = head_config();
    if (variant == 1) {
      hc.rope_yarn = true;
      hc.yarn = RopeConfig{};
      hc.yarn.theta = hc.rope_theta = 150000.0;
      hc.norm_before_residual = true;
    }
    const std::string dir = temp_dir("script" + std::to_string(variant));
    make_random_eagle3(hc, dir, 7 + variant, variant == 0);
    HostEagle3Head head(std::make_unique<Eagle3Drafter>(Eagle3Weights::load(dir), t, target()->embed));
    const int width = head.drafter().tap_width(), V = hc.draft_vocab, L = 700;
    std::mt19937_64 r(1234 + variant);
    std::vector<int32_t> tokens(L + 2);
    for (auto& x : tokens) x = int32_t(r() % uint64_t(t.vocab));
    const auto taps = random_taps(L, width, 99 + variant);
    std::unique_ptr<Eagle3Head::Seq> seq[2];
    int end[2] = {0, 0}, first[2] = {0, 0}, steps = 0, restarts = 0;
    for (int q = 0; q < 2; ++q) seq[q] = head.new_seq();
    for (int step = 0; step < 120; ++step) {
      const int q = step % 2;
      int pos, n;
      if (step < 2) {
        pos = 0;
        n = 37 + 300 * q;
      } else if (step == 40 + q || step == 90 + q) {
        pos = end[q] + 5;
        n = 3;
      } else {
        pos = end[q] - (r() % 4 == 0 ? 1 : 0);
        n = 1 + int(r() % 4);
      }
      if (pos + n > L) break;
      if (pos > end[q] || step < 2) {
        first[q] = pos;
        restarts += step >= 2;
      }
      Eagle3Taps tp;
      tp.host = taps.data() + size_t(pos) * width;
      head.commit(*seq[q], pos, n, tokens.data() + pos + 1, tp);
      end[q] = pos + n;
      const int k = 1 + int(r() % 4);
      std::vector<float> lg, ref_lg;
      const auto ids = head.propose(*seq[q], k, &lg);
      // The reference: a head that never restarted, fed rows first .. end - 1 at positions 0 ...
      auto fresh = head.new_seq();
      tp.host = taps.data() + size_t(first[q]) * width;
      head.commit(*fresh, 0, end[q] - first[q], tokens.data() + first[q] + 1, tp);
      const auto ref_ids = head.propose(*fresh, k, &ref_lg);
      const std::string where = "variant " + std::to_string(variant) + " step " + std::to_string(step);
      ASSERT_EQ(ids.size(), size_t(k)) << where;
      ASSERT_EQ(lg.size(), size_t(k) * V) << where;
      ASSERT_EQ(ref_lg.size(), lg.size()) << where;
      for (int j = 0; j < k; ++j) {
        const float* a = &lg[size_t(j) * V];
        const float* b = &ref_lg[size_t(j) * V];
        int bad = 0;
        for (int i = 0; i < V; ++i) bad += !std::isfinite(a[i]);
        ASSERT_EQ(bad, 0) << where << " draft " << j << ": non-finite logits";
        for (int i = 0; i < V; ++i)
          ASSERT_NEAR(a[i], b[i], 1e-4f * (1 + std::abs(b[i]))) << where << " draft " << j << " id " << i;
        if (ids[j] != ref_ids[j]) break;  // a near tie: the chains now run on different tokens
      }
      ++steps;
    }
    EXPECT_GT(steps, 100) << "variant " << variant;
    EXPECT_EQ(restarts, 4) << "variant " << variant;
    fs::remove_all(dir);
  }
}

namespace {

std::vector<int32_t> prompt_of(int i) {
  std::vector<int32_t> p;
  const int len = 5 + (i * 7) % 17;
  for (int k = 0; k < len; ++k) p.push_back((k * 31 + i * 17 + 3) % 500);
  return p;
}

EngineConfig config(const std::string& head, int k, bool adaptive = true) {
  EngineConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 256;
  c.max_model_len = 128;
  if (k > 0) {
    c.speculative = parse_speculative_config(R"({"method":"eagle3","model":")" + head +
                                             R"(","num_speculative_tokens":)" + std::to_string(k) + "}");
    c.speculative.target_model = kFixture;  // the fixture heads share the target's embedding
    c.speculative.adaptive = adaptive;
  }
  return c;
}

struct SpecRun {
  std::vector<std::vector<int32_t>> tokens;
  int64_t drafted = 0, accepted = 0;
};

// Every request at once, stepped until idle; after each step the full-attention pool holds
// exactly the pages of the computed positions (rejected drafts' pages given back).
SpecRun serve(const EngineConfig& c, const std::vector<std::vector<int32_t>>& prompts, const std::vector<SamplingParams>& sps) {
  Engine e(backend(), c);
  SpecRun out;
  out.tokens.resize(prompts.size());
  std::vector<std::shared_ptr<RequestStream>> ss;
  std::vector<bool> done(prompts.size(), false);
  for (size_t i = 0; i < prompts.size(); ++i) ss.push_back(e.submit(prompts[i], sps[i]));
  while (e.step()) {
    int expect_pages = 0;
    for (size_t i = 0; i < ss.size(); ++i) {
      while (auto ev = ss[i]->next(std::chrono::milliseconds(0))) {
        out.tokens[i].insert(out.tokens[i].end(), ev->tokens.begin(), ev->tokens.end());
        if (ev->finished) done[i] = true;
      }
      const int computed = int(prompts[i].size() + out.tokens[i].size()) - 1;
      if (!done[i] && !out.tokens[i].empty()) expect_pages += (computed + c.page_size - 1) / c.page_size;
    }
    EXPECT_EQ(e.stats().kv_pages_used[kKvFull], expect_pages);
  }
  EXPECT_EQ(e.stats().kv_pages_used[kKvFull], 0);
  EXPECT_EQ(e.stats().kv_pages_used[kKvSliding], 0);
  out.drafted = e.metrics().spec_draft_tokens.load();
  out.accepted = e.metrics().spec_accepted_tokens.load();
  return out;
}

using test::greedy;

// A head whose drafts are always target token `tok`: lm_head all zeros (every draft logit
// ties, so draft id 0 wins) and d2t[0] = tok.
std::string constant_head(int32_t tok) {
  return edited_head(random_head("const-src"), "const-" + std::to_string(tok), [&](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "lm_head.weight") std::fill(b.begin(), b.end(), 0);
    if (s.name == "d2t") {
      const int64_t off = tok;
      std::memcpy(b.data(), &off, 8);
    }
    return true;
  });
}

}  // namespace

// A random head: drafts almost never match, and the output is plain decoding's, K = 1..3.
TEST(Eagle3Engine, GreedyEqualsPlainWithRandomHead) {
  const int n = 6, max_tokens = 24;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(prompt_of(i));
  std::vector<SamplingParams> sps(n, greedy(max_tokens));
  const SpecRun plain = serve(config("", 0), prompts, sps);
  for (int k = 1; k <= 3; ++k) {
    const SpecRun spec = serve(config(random_head("engine"), k, false), prompts, sps);
    std::printf("random head K=%d: %lld drafts, %lld accepted\n", k, (long long)spec.drafted, (long long)spec.accepted);
    EXPECT_GT(spec.drafted, 0) << k;
    for (int i = 0; i < n; ++i) EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "K=" << k << " request " << i;
  }
  // Adaptive K: the misses pause drafting, the head is skipped while paused and restarts its
  // cache before each probe; still plain decoding's output.
  const SpecRun adaptive = serve(config(random_head("engine"), 2, true), prompts, sps);
  std::printf("random head, adaptive K<=2: %lld drafts\n", (long long)adaptive.drafted);
  EXPECT_GT(adaptive.drafted, 0);
  EXPECT_LT(adaptive.drafted, n * max_tokens / 3);
  for (int i = 0; i < n; ++i) EXPECT_EQ(adaptive.tokens[i], plain.tokens[i]) << "adaptive request " << i;
}

// A head that drafts the token plain decoding emits most often: drafts are accepted (the head
// then commits the accepted rows plus the bonus row; with K = 3 the chained scratch rows after
// an accepted draft are dropped), and the output is still plain decoding's, greedy and seeded.
TEST(Eagle3Engine, AcceptedDraftsKeepTheOutput) {
  const int n = 6, max_tokens = 32;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(prompt_of(i + 20));
  std::vector<SamplingParams> sps(n, greedy(max_tokens));
  const SpecRun plain = serve(config("", 0), prompts, sps);
  std::map<int32_t, int> freq;
  for (auto& t : plain.tokens)
    for (int32_t x : t) ++freq[x];
  int32_t top = 0;
  for (auto& [t, f] : freq)
    if (f > freq[top]) top = t;
  std::printf("most frequent greedy token %d (%d of %d)\n", top, freq[top], n * max_tokens);
  ASSERT_GT(freq[top], 2);
  const std::string head = constant_head(top);
  for (int k : {1, 3}) {
    const SpecRun spec = serve(config(head, k, false), prompts, sps);
    std::printf("constant head K=%d: %lld drafts, %lld accepted\n", k, (long long)spec.drafted, (long long)spec.accepted);
    EXPECT_GT(spec.accepted, 0) << k;
    EXPECT_LT(spec.accepted, spec.drafted) << k;
    for (int i = 0; i < n; ++i) EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "K=" << k << " request " << i;
  }
  // seeded sampling: the same tokens with and without drafts (engine/speculative.h)
  std::vector<SamplingParams> sampled(n);
  for (int i = 0; i < n; ++i) {
    sampled[i].temperature = 0.7f;
    sampled[i].max_tokens = 16;
    sampled[i].seed = 100 + i;
    sampled[i].ignore_eos = true;
  }
  const SpecRun sp_plain = serve(config("", 0), prompts, sampled);
  const SpecRun sp_spec = serve(config(head, 2, true), prompts, sampled);
  for (int i = 0; i < n; ++i) EXPECT_EQ(sp_spec.tokens[i], sp_plain.tokens[i]) << "seeded request " << i;
}

// Prefill in chunks (a small token budget) and a head carrying its own embedding: still
// plain decoding's output; the head sees every prompt position.
TEST(Eagle3Engine, ChunkedPrefillAndOwnEmbedding) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(prompt_of(i + 40));
    for (int r = 0; r < 20 + i * 9; ++r) prompts.back().push_back((r * 13 + i) % 400);
  }
  std::vector<SamplingParams> sps(prompts.size(), greedy(12));
  EngineConfig pc = config("", 0), sc = config(random_head("own-embed", true), 2, false);
  pc.max_num_batched_tokens = sc.max_num_batched_tokens = 24;
  sc.speculative.target_model.clear();
  auto run = [&](const EngineConfig& c) {
    Engine e(backend(), c);
    std::vector<std::shared_ptr<RequestStream>> ss;
    for (auto& p : prompts) ss.push_back(e.submit(p, sps[0]));
    while (e.step()) {
    }
    EXPECT_EQ(e.stats().kv_pages_used[kKvFull], 0);
    std::vector<std::vector<int32_t>> out;
    for (auto& s : ss) {
      out.emplace_back();
      while (auto ev = s->next(std::chrono::milliseconds(0))) out.back().insert(out.back().end(), ev->tokens.begin(), ev->tokens.end());
    }
    return out;
  };
  EXPECT_EQ(run(sc), run(pc));
}

// What one draft token costs on this CPU (printed, not asserted): the tiny head here; set
// GPTOSS_EAGLE3_BENCH_HEAD to a head directory (e.g. make-model --preset eagle3-120b) and
// GPTOSS_EAGLE3_BENCH_TARGET_LAYERS to its target's layer count to time real shapes.
TEST(Eagle3Bench, DraftStepCost) {
  std::string dir = random_head("bench", true);
  int layers = 2;
  if (const char* d = std::getenv("GPTOSS_EAGLE3_BENCH_HEAD")) dir = d;
  if (const char* l = std::getenv("GPTOSS_EAGLE3_BENCH_TARGET_LAYERS")) layers = std::atoi(l);
  auto w = Eagle3Weights::load(dir);
  GptOssConfig tc = target()->config;
  tc.hidden = w->config.target_hidden;
  tc.vocab = w->config.vocab;
  tc.num_layers = layers;
  Eagle3Drafter dr(w, tc, nullptr);
  const int ctx = 64, width = dr.tap_width();
  std::vector<int32_t> next(ctx);
  for (int i = 0; i < ctx; ++i) next[i] = (i * 101 + 7) % w->config.vocab;
  const auto taps = random_taps(ctx, width, 5);
  Eagle3Drafter::State s;
  using clk = std::chrono::steady_clock;
  auto t0 = clk::now();
  dr.commit(s, 0, ctx, next.data(), taps.data());
  const double prefill = std::chrono::duration<double>(clk::now() - t0).count();
  const int steps = 8;
  t0 = clk::now();
  for (int i = 0; i < steps; ++i) dr.propose(s, 1);  // K=1: lm_head over the committed row
  const double k1 = std::chrono::duration<double>(clk::now() - t0).count() / steps;
  t0 = clk::now();
  for (int i = 0; i < steps; ++i) dr.propose(s, 4);
  const double k4 = std::chrono::duration<double>(clk::now() - t0).count() / steps;
  t0 = clk::now();
  for (int i = 0; i < steps; ++i) dr.commit(s, ctx - 1, 1, next.data() + ctx - 1, taps.data() + size_t(ctx - 1) * width);
  const double commit1 = std::chrono::duration<double>(clk::now() - t0).count() / steps;
  std::printf("eagle3 draft step on the CPU (H=%d, I=%d, draft vocab %d): commit %d rows %.3f ms (%.3f ms/row), "
              "commit 1 row %.3f ms, propose K=1 %.3f ms, K=4 %.3f ms (%.3f ms per chained token)\n",
              w->config.hidden, w->config.intermediate, w->config.draft_vocab, ctx, prefill * 1e3, prefill * 1e3 / ctx,
              commit1 * 1e3, k1 * 1e3, k4 * 1e3, (k4 - k1) * 1e3 / 3);
}
