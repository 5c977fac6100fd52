// Eagle3 on the CUDA backend: the hidden-state taps (ForwardBatch::tap_layers) against the exact
// CPU backend; the draft head on the GPU (backend/cuda/eagle3_head.h) against the host head
// (engine/eagle3_drafter.h, exact fp32) over many commits, proposals and rollbacks, and with the
// taps left on the device; the engine with method eagle3 on the GPU giving plain decoding's
// greedy output (batch-invariant mode, so a verify row's numerics equal a plain decode row's),
// with the head on the host and on the GPU. CudaEagle3Bench times the device draft step.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>

#include "backend/backend_factory.h"
#include "cuda_test_util.h"
#include "engine/eagle3_drafter.h"
#include "engine/engine.h"
#include "engine/speculative.h"
#include "model/eagle3_weights.h"

namespace gptoss {
namespace {

using namespace gptoss::test;

const std::string kFixture = tiny_fixture_dir();

std::unique_ptr<Backend> make(const std::string& device, bool batch_invariant = false) {
  BackendOptions o;
  o.device = device;
  o.model_dir = kFixture;
  o.batch_invariant = batch_invariant;
  return create_backend(o);
}

class CudaEagle3 : public CudaTest {};

// Prefill 21 tokens, then a 3-token verify-like pass, tapping layers {0, 1, 1}.
std::vector<float> taps_of(Backend& be, const std::vector<int32_t>& tokens) {
  KvCacheConfig kv;
  kv.page_size = 16;
  kv.num_pages[kKvFull] = kv.num_pages[kKvSliding] = 4;
  be.init_kv_cache(kv);
  std::vector<int32_t> pages(4);
  std::iota(pages.begin(), pages.end(), 0);
  std::vector<float> out;
  const int H = be.config().hidden;
  int at = 0;
  for (int n : {21, 3}) {
    ForwardBatch fb;
    fb.tokens.assign(tokens.begin() + at, tokens.begin() + at + n);
    SeqBatchInfo s;
    s.n_tokens = n;
    s.start_pos = at;
    for (int g = 0; g < 2; ++g) {
      s.pages[g] = pages.data();
      s.n_pages[g] = 4;
    }
    fb.seqs.push_back(s);
    fb.logit_rows.push_back(n - 1);
    fb.tap_layers = {0, 1, 1};
    std::vector<float> taps(size_t(n) * 3 * H, -1e30f), logits(be.config().vocab);
    fb.tap_out = taps.data();
    be.forward(fb, logits.data());
    out.insert(out.end(), taps.begin(), taps.end());
    at += n;
  }
  return out;
}

TEST_F(CudaEagle3, TapsMatchCpu) {
  auto gpu = make("cuda"), cpu = make("cpu");
  ASSERT_TRUE(gpu->supports_hidden_taps());
  FastRng r(fresh_seed());
  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back(int(r.next() % cpu->config().vocab));
  auto tg = taps_of(*gpu, tokens), tc = taps_of(*cpu, tokens);
  ASSERT_EQ(tg.size(), tc.size());
  const double err = rel_err(tg, tc);
  std::printf("eagle3 taps, cuda vs cpu: rel err %.3g\n", err);
  EXPECT_LT(err, 2e-2);
}

// A head for the fixture (hidden 64, vocab 512, 2 layers); head_dim 16 is one the CUDA head
// does not take (the engine then runs it on the host), 32 one it does.
Eagle3Config fixture_head(const GptOssConfig& t, int head_dim) {
  Eagle3Config hc = Eagle3Config::preset("eagle3-tiny");
  hc.hidden = hc.target_hidden = t.hidden;
  hc.num_heads = 4;
  hc.num_kv_heads = 2;
  hc.head_dim = head_dim;
  hc.intermediate = 96;
  hc.vocab = t.vocab;
  hc.draft_vocab = 128;
  hc.aux_layers = {0, 1, 1};
  return hc;
}

std::string temp_head(const Eagle3Config& hc, uint64_t seed, bool with_embed = true) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("gptoss-cuda-eagle3-" + std::to_string(fresh_seed()))).string();
  make_random_eagle3(hc, dir, seed, with_embed);
  return dir;
}

// Compares one proposal of the device head with the host head's: logits finite (a NaN or inf
// on either side fails the step outright: std::max and the comparisons below would pass over
// it) and within bf16 tolerance, the same draft ids, except where the host's best two logits
// are closer than the error (then the chain behind that step drafts from another token and is
// not compared). Returns the steps whose ids agreed; `compared` gets the steps looked at.
int compare_proposal(const std::vector<int32_t>& want, const std::vector<float>& want_lg, const std::vector<int32_t>& got,
                     const std::vector<float>& got_lg, int V, int* compared, const std::string& where) {
  EXPECT_EQ(got.size(), want.size()) << where;
  EXPECT_EQ(got_lg.size(), want_lg.size()) << where;
  int agree = 0;
  for (size_t j = 0; j < std::min(got.size(), want.size()) && (j + 1) * V <= std::min(got_lg.size(), want_lg.size());
       ++j) {
    const float* a = want_lg.data() + j * V;
    const float* b = got_lg.data() + j * V;
    ++*compared;
    int bad_host = 0, bad_dev = 0;
    for (int i = 0; i < V; ++i) {
      bad_host += !std::isfinite(a[i]);
      bad_dev += !std::isfinite(b[i]);
    }
    if (bad_host || bad_dev) {
      ADD_FAILURE() << where << " step " << j << ": non-finite logits, " << bad_host << " of " << V << " on the host head, "
                    << bad_dev << " on the device head";
      break;
    }
    double scale = 0, err = 0;
    for (int i = 0; i < V; ++i) {
      scale = std::max(scale, double(std::fabs(a[i])));
      err = std::max(err, double(std::fabs(a[i] - b[i])));
    }
    EXPECT_LT(err, 3e-2 * scale + 1e-3) << where << " step " << j << ": logits differ by " << err << " (scale " << scale << ")";
    if (got[j] == want[j]) {
      ++agree;
      continue;
    }
    const int ia = int(std::max_element(a, a + V) - a), ib = int(std::max_element(b, b + V) - b);
    EXPECT_LE(a[ia] - a[ib], 2 * err + 1e-4) << where << " step " << j << ": device draft " << got[j] << " vs host "
                                             << want[j] << " is not a near tie";
    break;  // the chains now run on different tokens
  }
  return agree;
}

struct HeadPair {
  std::unique_ptr<Eagle3Head> dev;
  std::unique_ptr<HostEagle3Head> host;
};

// A head without embed_tokens shares the target's embedding: the device head the backend's, the
// host head the fixture checkpoint's.
HeadPair head_pair(Backend& gpu, const std::string& dir) {
  auto w = Eagle3Weights::load(dir);
  HeadPair p;
  p.dev = gpu.make_eagle3_head(w);
  std::shared_ptr<Checkpoint> target;
  const TensorView* embed = nullptr;
  if (!w->embed) {
    target = std::make_shared<Checkpoint>(kFixture);
    embed = &target->get("model.embed_tokens.weight");
  }
  p.host = std::make_unique<HostEagle3Head>(std::make_unique<Eagle3Drafter>(w, gpu.config(), embed, target));
  return p;
}

// Many steps of what the engine does, on two interleaved sequences: a prompt commit, then
// proposals of 1..4 tokens and commits of 1..K+1 rows, rewinding a row now and then, jumping
// ahead (a restart, as after a prefix-cache hit) twice; host taps. Plain RoPE and the head's own
// embedding, then YaRN, norm_before_residual and the target's embedding. Where the host's best
// two logits are closer than the bf16 error the ids may differ; most steps must agree.
TEST_F(CudaEagle3, DeviceHeadMatchesHostHead) {
  auto gpu = make("cuda");
  const GptOssConfig& t = gpu->config();
  for (int variant = 0; variant < 2; ++variant) {
    Eagle3Config hc = fixture_head(t, 32);
    if (variant == 1) {
      hc.rope_yarn = true;
      hc.yarn = RopeConfig{};
      hc.yarn.theta = hc.rope_theta = 150000.0;
      hc.norm_before_residual = true;
    }
    const std::string dir = temp_head(hc, 7 + variant, variant == 0);
    HeadPair hp = head_pair(*gpu, dir);
    ASSERT_TRUE(hp.dev) << "the CUDA backend made no head";
    EXPECT_EQ(hp.dev->where(), "cuda");
    EXPECT_TRUE(hp.dev->device_taps());
    const uint64_t seed = fresh_seed();
    FastRng r(seed);
    const int width = 3 * hc.target_hidden, L = 700;
    std::vector<int32_t> tokens(L + 2);
    for (auto& x : tokens) x = int32_t(r.next() % uint64_t(t.vocab));
    const std::vector<float> taps = rand_f32(size_t(L) * width, r);
    std::unique_ptr<Eagle3Head::Seq> ds[2], hs[2];
    int end[2] = {0, 0}, agree = 0, compared = 0;
    for (int q = 0; q < 2; ++q) {
      ds[q] = hp.dev->new_seq();
      hs[q] = hp.host->new_seq();
      EXPECT_TRUE(hp.dev->propose(*ds[q], 2).empty()) << "nothing committed: no drafts";
    }
    for (int step = 0; step < 120; ++step) {
      const int q = step % 2;
      int pos, n;
      if (step < 2) {
        pos = 0;
        n = 37 + 300 * q;  // the second prompt spans two of the head's commit chunks
      } else if (step == 40 + q || step == 90 + q) {
        pos = end[q] + 5;  // positions the head never saw: it restarts there
        n = 3;
      } else {
        pos = end[q] - (r.next() % 4 == 0 ? 1 : 0);
        n = 1 + int(r.next() % 4);
      }
      if (pos + n > L) break;
      Eagle3Taps tp;
      tp.host = taps.data() + size_t(pos) * width;
      hp.host->commit(*hs[q], pos, n, tokens.data() + pos + 1, tp);
      hp.dev->commit(*ds[q], pos, n, tokens.data() + pos + 1, tp);
      end[q] = pos + n;
      const int k = 1 + int(r.next() % 4);
      std::vector<float> lh, ld;
      const auto want = hp.host->propose(*hs[q], k, &lh);
      const auto got = hp.dev->propose(*ds[q], k, &ld);
      agree += compare_proposal(want, lh, got, ld, hc.draft_vocab, &compared,
                                "variant " + std::to_string(variant) + " step " + std::to_string(step) + " seed " +
                                    std::to_string(seed));
    }
    std::printf("eagle3 head variant %d: %d of %d draft steps agree with the host head\n", variant, agree, compared);
    EXPECT_GT(compared, 200);
    EXPECT_GE(agree, compared * 8 / 10);
    std::filesystem::remove_all(dir);
  }
}

// The taps the backend leaves on the device give the drafts the host copies of the same pass
// give (both rounded to bf16 the same way): a two-sequence batch, the second sequence's rows
// read at its batch offset. First an eager pass (a 21-token sequence), run alike both times:
// the same ids; then a decode-sized pass, which with device taps runs as a graph (other kernel
// splits than the eager pass the host taps take): ids equal up to near ties.
TEST_F(CudaEagle3, DeviceTapsEqualHostTaps) {
  auto gpu = make("cuda");
  const GptOssConfig& t = gpu->config();
  const std::string dir = temp_head(fixture_head(t, 32), 3);
  HeadPair hp = head_pair(*gpu, dir);
  ASSERT_TRUE(hp.dev);
  KvCacheConfig kv;
  kv.page_size = 16;
  kv.num_pages[kKvFull] = kv.num_pages[kKvSliding] = 8;
  gpu->init_kv_cache(kv);
  std::vector<int32_t> pages[2] = {{0, 1, 2, 3}, {4, 5, 6, 7}};
  FastRng r(fresh_seed());
  std::vector<int32_t> toks[2];
  for (int q = 0; q < 2; ++q)
    for (int i = 0; i < 40; ++i) toks[q].push_back(int32_t(r.next() % uint64_t(t.vocab)));
  std::unique_ptr<Eagle3Head::Seq> from_host[2], from_dev[2];
  for (int q = 0; q < 2; ++q) {
    from_host[q] = hp.dev->new_seq();
    from_dev[q] = hp.dev->new_seq();
  }
  const int width = 3 * t.hidden;
  int at[2] = {0, 0}, round = 0;
  for (auto lens : {std::pair{5, 21}, std::pair{2, 3}}) {
    ForwardBatch fb;
    const int n[2] = {lens.first, lens.second};
    for (int q = 0; q < 2; ++q) {
      SeqBatchInfo s;
      s.first_token = int32_t(fb.tokens.size());
      s.n_tokens = n[q];
      s.start_pos = at[q];
      for (int g = 0; g < 2; ++g) {
        s.pages[g] = pages[q].data();
        s.n_pages[g] = 4;
      }
      fb.tokens.insert(fb.tokens.end(), toks[q].begin() + at[q], toks[q].begin() + at[q] + n[q]);
      fb.seqs.push_back(s);
      fb.logit_rows.push_back(s.first_token + n[q] - 1);
    }
    fb.tap_layers = {0, 1, 1};
    std::vector<float> host_taps(fb.tokens.size() * width), logits(2 * size_t(t.vocab));
    fb.tap_out = host_taps.data();
    gpu->forward(fb, logits.data());
    for (int q = 0; q < 2; ++q) {
      Eagle3Taps tp;
      tp.host = host_taps.data() + size_t(fb.seqs[size_t(q)].first_token) * width;
      hp.dev->commit(*from_host[q], at[q], n[q], toks[q].data() + at[q] + 1, tp);
    }
    // The same pass again (same K/V rewritten), the taps left on the device.
    fb.tap_out = nullptr;
    fb.taps_on_device = true;
    gpu->forward(fb, logits.data());
    for (int q = 0; q < 2; ++q) {
      Eagle3Taps tp;
      tp.batch_token = fb.seqs[size_t(q)].first_token;
      hp.dev->commit(*from_dev[q], at[q], n[q], toks[q].data() + at[q] + 1, tp);
    }
    for (int q = 0; q < 2; ++q) {
      std::vector<float> a, b;
      const auto da = hp.dev->propose(*from_host[q], 3, &a);
      const auto db = hp.dev->propose(*from_dev[q], 3, &b);
      int compared = 0;
      const int agree = compare_proposal(da, a, db, b, 128, &compared, "seq " + std::to_string(q));
      if (round == 0) {
        EXPECT_EQ(agree, 3) << "seq " << q << " after " << n[q] << " tokens";
      }
      at[q] += n[q];
    }
    ++round;
  }
  std::filesystem::remove_all(dir);
}

// The engine of the end-to-end tests: a few short sequences; eagle3 with K fixed drafts (no
// adaptive K) when k > 0, plain decoding otherwise.
EngineConfig engine_config(const std::string& head, int k) {
  EngineConfig c;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 256;
  c.max_model_len = 128;
  if (k > 0) {
    c.speculative = parse_speculative_config(R"({"method":"eagle3","model":")" + head +
                                             R"(","num_speculative_tokens":)" + std::to_string(k) + "}");
    c.speculative.adaptive = false;
  }
  return c;
}

// Every token each finished stream produced, stream by stream.
std::vector<std::vector<int32_t>> drained_tokens(const std::vector<std::shared_ptr<RequestStream>>& streams) {
  std::vector<std::vector<int32_t>> out;
  for (auto& st : streams) {
    out.emplace_back();
    while (auto ev = st->next(std::chrono::milliseconds(0))) out.back().insert(out.back().end(), ev->tokens.begin(), ev->tokens.end());
  }
  return out;
}

// Greedy eagle3 K=1..3 equal to plain decoding: the head on the host (head_dim 16, which the
// CUDA head does not take), then on the GPU with the taps on the device, then that head forced
// onto the host (GPTOSS_EAGLE3_HOST=1).
TEST_F(CudaEagle3, GreedyEqualsPlainOnCuda) {
  auto gpu = make("cuda", true);
  for (int variant = 0; variant < 3; ++variant) {
    const Eagle3Config hc = fixture_head(gpu->config(), variant == 0 ? 16 : 32);
    const std::string head = temp_head(hc, 1);
    if (variant == 2) setenv("GPTOSS_EAGLE3_HOST", "1", 1);
    auto run = [&](int k) {
      Engine e(*gpu, engine_config(head, k));
      if (k > 0) {
        EXPECT_EQ(e.eagle3_head_where(), variant == 1 ? "cuda" : "host");
      }
      std::vector<std::shared_ptr<RequestStream>> ss;
      for (int i = 0; i < 4; ++i) {
        std::vector<int32_t> p;
        for (int j = 0; j < 9 + 5 * i; ++j) p.push_back((j * 31 + i * 17 + 3) % hc.vocab);
        SamplingParams sp;
        sp.temperature = 0;
        sp.max_tokens = 24;
        sp.ignore_eos = true;
        ss.push_back(e.submit(p, sp));
      }
      const auto t0 = std::chrono::steady_clock::now();
      while (e.step()) {
      }
      std::printf("head %d, K=%d: %.1f ms, %lld drafts\n", variant, k,
                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                  (long long)e.metrics().spec_draft_tokens.load());
      EXPECT_EQ(e.stats().kv_pages_used[kKvFull], 0);
      return drained_tokens(ss);
    };
    const auto plain = run(0);
    for (int k = 1; k <= 3; ++k) EXPECT_EQ(run(k), plain) << "head variant " << variant << ", K=" << k;
    unsetenv("GPTOSS_EAGLE3_HOST");
    std::filesystem::remove_all(head);
  }
}

// Drafts that are often right, from the GPU head: lm_head all zeros (every draft logit ties, so
// draft id 0 wins; the device argmax breaks ties to the lower id as the host's does) and
// d2t[0] = the most frequent token of plain greedy decoding. The engine then commits accepted
// drafts' rows from the device taps and rewinds the head past the rejected ones; the output
// stays plain decoding's.
TEST_F(CudaEagle3, AcceptedDraftsKeepTheOutputOnGpu) {
  auto gpu = make("cuda", true);
  const Eagle3Config hc = fixture_head(gpu->config(), 32);
  const std::string src = temp_head(hc, 2);
  auto serve = [&](const std::string& head, int k, int64_t* drafted, int64_t* accepted) {
    Engine e(*gpu, engine_config(head, k));
    if (k > 0) {
      EXPECT_EQ(e.eagle3_head_where(), "cuda");
    }
    std::vector<std::shared_ptr<RequestStream>> ss;
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> p;
      for (int j = 0; j < 12 + 3 * i; ++j) p.push_back((j * 7 + i * 5 + 11) % hc.vocab);
      SamplingParams sp;
      sp.temperature = 0;
      sp.max_tokens = 32;
      sp.ignore_eos = true;
      ss.push_back(e.submit(p, sp));
    }
    while (e.step()) {
    }
    if (drafted) *drafted = e.metrics().spec_draft_tokens.load();
    if (accepted) *accepted = e.metrics().spec_accepted_tokens.load();
    return drained_tokens(ss);
  };
  const auto plain = serve("", 0, nullptr, nullptr);
  std::map<int32_t, int> freq;
  for (auto& t : plain)
    for (int32_t x : t) ++freq[x];
  int32_t top = plain.at(0).at(0);
  for (auto& [t, f] : freq)
    if (f > freq[top]) top = t;
  ASSERT_GT(freq[top], 2) << "no token repeats in the plain outputs: nothing for a constant head to hit";
  // The constant head: the random one with lm_head zeroed and d2t[0] = top.
  const std::string head = src + "-const";
  {
    Checkpoint ck(src);
    std::vector<TensorSpec> specs;
    for (const auto& n : ck.names()) specs.push_back({n, ck.get(n).dtype, ck.get(n).shape});
    std::filesystem::create_directories(head);
    write_safetensors(head + "/model.safetensors", specs, [&](const TensorSpec& sp, uint8_t* out) {
      const TensorView& t = ck.get(sp.name);
      std::memcpy(out, t.data, t.nbytes);
      if (sp.name == "lm_head.weight") std::memset(out, 0, t.nbytes);
      if (sp.name == "d2t") {
        const int64_t off = top;
        std::memcpy(out, &off, 8);
      }
    });
    std::filesystem::copy_file(src + "/config.json", head + "/config.json");
  }
  for (int k : {1, 3}) {
    int64_t drafted = 0, accepted = 0;
    const auto spec = serve(head, k, &drafted, &accepted);
    std::printf("constant GPU head K=%d: %lld drafts, %lld accepted\n", k, (long long)drafted, (long long)accepted);
    EXPECT_GT(accepted, 0) << k;
    EXPECT_LT(accepted, drafted) << k;
    EXPECT_EQ(spec, plain) << "K=" << k;
  }
  std::filesystem::remove_all(src);
  std::filesystem::remove_all(head);
}

// The draft step on the GPU, timed (prints, never fails). Default: a small head on the tiny
// fixture. GPTOSS_EAGLE3_BENCH_HEAD=DIR (gptoss make-model --preset eagle3-120b|eagle3-20b) with
// GPTOSS_EAGLE3_BENCH_TARGET=120b|20b (random target weights of that shape on the GPU) times a
// real-shape head; GPTOSS_EAGLE3_DENSE=gemv runs its matrices on the GEMV instead of the skinny
// tensor-core kernels. Host taps (uploaded per commit, 17 KB a row at 120b); in the engine they stay
// on the device.
TEST_F(CudaEagle3, DraftStepCost) {
  const char* head_dir = std::getenv("GPTOSS_EAGLE3_BENCH_HEAD");
  const char* target = std::getenv("GPTOSS_EAGLE3_BENCH_TARGET");
  std::unique_ptr<Backend> gpu;
  if (head_dir && target) {
    BackendOptions o;
    o.device = "cuda";
    o.random_weights = target;
    gpu = create_backend(o);
  } else {
    gpu = make("cuda");
  }
  const std::string dir = head_dir && target ? std::string(head_dir) : temp_head(fixture_head(gpu->config(), 32), 5);
  auto w = Eagle3Weights::load(dir);
  const Eagle3Config& hc = w->config;
  auto dev = gpu->make_eagle3_head(w);
  ASSERT_TRUE(dev);
  FastRng r(1);
  const int ctx = 512, width = 3 * hc.target_hidden, steps = 50;
  std::vector<int32_t> next(ctx + 2 * steps + 2);
  for (auto& x : next) x = int32_t(r.next() % uint64_t(hc.vocab));
  const std::vector<float> taps = rand_f32(size_t(ctx + steps + 1) * width, r);
  using clk = std::chrono::steady_clock;
  auto ms = [](clk::time_point a) { return std::chrono::duration<double, std::milli>(clk::now() - a).count(); };
  auto seq = dev->new_seq();
  Eagle3Taps tp;
  tp.host = taps.data();
  dev->commit(*seq, 0, ctx, next.data(), tp);  // warm-up (first-use allocations)
  dev->propose(*seq, 4);
  auto t0 = clk::now();
  dev->commit(*seq, 0, ctx, next.data(), tp);
  dev->propose(*seq, 1);
  const double prompt = ms(t0);
  double per_k[5] = {0, 0, 0, 0, 0};
  for (int k : {1, 2, 4}) {
    t0 = clk::now();
    for (int i = 0; i < steps; ++i) {  // commit the row that stood, then draft k
      Eagle3Taps ti;
      ti.host = taps.data() + size_t(ctx - 1) * width;
      dev->commit(*seq, ctx - 1, 1, next.data() + ctx - 1, ti);
      dev->propose(*seq, k);
    }
    per_k[k] = ms(t0) / steps;
  }
  t0 = clk::now();
  for (int i = 0; i < steps; ++i) dev->propose(*seq, 1);
  const double lm_only = ms(t0) / steps;
  const char* dense = std::getenv("GPTOSS_EAGLE3_DENSE");
  std::printf("eagle3 draft step on cuda, %s kernels (H=%d, heads %dx%d, kv %d, I=%d, draft vocab %d, context %d): "
              "commit %d rows + propose 1: %.3f ms; per step (commit 1 row + propose K): K=1 %.3f ms, K=2 %.3f ms, "
              "K=4 %.3f ms (%.3f ms per chained token); propose K=1 alone (norm + lm_head + argmax) %.3f ms\n",
              dense ? dense : "skinny", hc.hidden, hc.num_heads, hc.head_dim, hc.num_kv_heads, hc.intermediate, hc.draft_vocab, ctx, ctx, prompt,
              per_k[1], per_k[2], per_k[4], (per_k[4] - per_k[1]) / 3, lm_only);
  if (!(head_dir && target)) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gptoss
