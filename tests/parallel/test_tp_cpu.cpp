// Tensor parallelism on the CPU backend: TP 2/4/8 (both expert shardings where the shapes
// allow) against TP 1 on the tiny fixture and on a model of the real attention/MoE shapes (64 q
// heads, 8 kv heads, intermediate 2880 = 90 blocks of 32, split unevenly) made small: logits
// within fp32 summation-order noise, greedy tokens equal, through the engine too; the refusals
// with their messages; a failing rank; and the launcher's process group (two gptoss processes
// bootstrapped from RANK/WORLD_SIZE/MASTER_*, and from Slurm's variables) giving TP 1's tokens,
// with a worker killed mid-run taking the group down with a clear error.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <fcntl.h>
#include <signal.h>

#include <mutex>

#include "backend/backend_factory.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/parallel/local_communicator.h"
#include "backend/parallel/tp_backend.h"
#include "common/error.h"
#include "engine/engine.h"
#include "model/make_model.h"
#include "model/weights.h"
#include "test_util.h"
#include "free_port.h"

extern char** environ;

namespace gptoss {
namespace {

const std::string kTiny = std::string(GPTOSS_TEST_DATA) + "/tiny-gptoss";
const std::string kGptoss = std::string(GPTOSS_BINARY_DIR) + "/gptoss";

// The real model's attention and MoE shapes on a small hidden size, vocabulary and depth.
const std::string& real_shape_model() {
  static std::string dir = [] {
    GptOssConfig c = GptOssConfig::preset("120b");
    c.hidden = 256;
    c.num_layers = 2;
    c.layer_sliding = {true, false};
    c.num_experts = 8;
    c.experts_per_token = 4;
    c.vocab = 1003;  // split unevenly at every N
    c.eos_token_id = 1000;
    c.pad_token_id = 1001;
    c.sliding_window = 8;
    c.max_position_embeddings = 4096;
    std::string d = test::temp_dir("tp-real-shape");
    make_random_model(c, d, 11);
    return d;
  }();
  return dir;
}

std::unique_ptr<Backend> backend(const std::string& model, int tp, ExpertSharding s = ExpertSharding::kIntermediate) {
  BackendOptions o;
  o.model_dir = model;
  o.threads = 2;
  o.tensor_parallel_size = tp;
  o.tp_expert_sharding = s;
  return create_backend(o);
}

// One sequence, page i = positions 16i.., through forward() (logits, host argmax) or
// forward_greedy().
struct Run {
  std::vector<float> logits;  // prefill rows, then one row per decode step
  std::vector<int32_t> tokens;
};

Run run(Backend& be, const std::vector<int32_t>& prompt, int n_new, bool greedy_on_backend) {
  const int P = 16, max = int(prompt.size()) + n_new + 1, n_pages = (max + P - 1) / P;
  KvCacheConfig kv;
  kv.page_size = P;
  kv.num_pages[0] = kv.num_pages[1] = n_pages;
  be.init_kv_cache(kv);
  std::vector<int32_t> pages(n_pages);
  for (int i = 0; i < n_pages; ++i) pages[i] = i;
  const int V = be.config().vocab;
  Run out;
  std::vector<int32_t> next = prompt;
  int len = 0;
  for (int step = 0; step <= n_new; ++step) {
    ForwardBatch b;
    b.tokens = next;
    SeqBatchInfo s;
    s.n_tokens = int(next.size());
    s.start_pos = len;
    for (int g = 0; g < 2; ++g) {
      s.pages[g] = pages.data();
      s.n_pages[g] = n_pages;
    }
    b.seqs.push_back(s);
    const int first_row = greedy_on_backend || step > 0 ? int(next.size()) - 1 : 0;
    for (int r = first_row; r < int(next.size()); ++r) b.logit_rows.push_back(r);
    int32_t tok = 0;
    if (greedy_on_backend) {
      be.forward_greedy(b, &tok);
    } else {
      std::vector<float> l(b.logit_rows.size() * size_t(V));
      be.forward(b, l.data());
      out.logits.insert(out.logits.end(), l.begin(), l.end());
      const float* last = &l[(b.logit_rows.size() - 1) * V];
      tok = int32_t(std::max_element(last, last + V) - last);
    }
    len += int(next.size());
    if (step == n_new) break;
    out.tokens.push_back(tok);
    next = {tok};
  }
  return out;
}

std::vector<int32_t> prompt_for(const GptOssConfig& c, int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + 11) % (c.vocab - 5));
  return p;
}

// Each logit row's error relative to its norm, the worst of them.
double worst_row_error(const std::vector<float>& a, const std::vector<float>& ref, int V) {
  double worst = 0;
  for (size_t r = 0; r * V < ref.size(); ++r) worst = std::max(worst, test::rel_error(&a[r * V], &ref[r * V], V));
  return worst;
}

void expect_matches_tp1(const std::string& model, int tp, ExpertSharding s, int prompt_len, int n_new) {
  auto ref_be = backend(model, 1);
  const auto prompt = prompt_for(ref_be->config(), prompt_len);
  const Run ref = run(*ref_be, prompt, n_new, false);
  const GptOssConfig whole = ref_be->config();
  ref_be.reset();
  auto be = backend(model, tp, s);
  EXPECT_EQ(be->config().num_heads, whole.num_heads);  // the whole model's config, not a rank's
  EXPECT_EQ(be->config().vocab, whole.vocab);
  const Run got = run(*be, prompt, n_new, false);
  const Run greedy = run(*be, prompt, n_new, true);
  const int V = be->config().vocab;
  ASSERT_EQ(got.logits.size(), ref.logits.size());
  const double err = worst_row_error(got.logits, ref.logits, V);
  std::printf("TP %d %s: worst row relative error %.2e\n", tp, expert_sharding_name(s), err);
  EXPECT_LT(err, 2e-6) << "TP " << tp << " " << expert_sharding_name(s);
  EXPECT_GT(err, 0.0) << "bit-identical logits: is the model split at all?";
  EXPECT_EQ(got.tokens, ref.tokens) << "TP " << tp << " " << expert_sharding_name(s);
  EXPECT_EQ(greedy.tokens, ref.tokens) << "TP " << tp << " " << expert_sharding_name(s) << " (forward_greedy)";
}

TEST(TpCpu, TinyFixtureMatchesTp1) {
  expect_matches_tp1(kTiny, 2, ExpertSharding::kIntermediate, 21, 12);
  expect_matches_tp1(kTiny, 2, ExpertSharding::kExpertParallel, 21, 12);
  expect_matches_tp1(kTiny, 4, ExpertSharding::kExpertParallel, 21, 12);
}

TEST(TpCpu, RealShapesMatchTp1) {
  for (int tp : {2, 4, 8})
    for (ExpertSharding s : {ExpertSharding::kIntermediate, ExpertSharding::kExpertParallel})
      expect_matches_tp1(real_shape_model(), tp, s, 13, 6);
}

// Models the group cannot split: a clear error before anything runs.
TEST(TpCpu, Refusals) {
  auto message = [](const std::string& model, int tp, ExpertSharding s) -> std::string {
    try {
      backend(model, tp, s);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(kTiny, 4, ExpertSharding::kIntermediate).find("use --tp-expert-sharding expert"), std::string::npos)
      << message(kTiny, 4, ExpertSharding::kIntermediate);
  EXPECT_NE(message(kTiny, 8, ExpertSharding::kExpertParallel).find("does not divide the model's 4 attention heads"),
            std::string::npos);
  EXPECT_NE(message(kTiny, 3, ExpertSharding::kIntermediate).find("must be 1, 2, 4 or 8"), std::string::npos);
  EXPECT_NE(message(kTiny, 0, ExpertSharding::kIntermediate).find("must be 1, 2, 4 or 8"), std::string::npos);
}

// The engine over a TpBackend: concurrent requests, greedy and seeded sampling, give TP 1's
// tokens.
std::vector<std::vector<int32_t>> serve(Backend& be) {
  EngineConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  c.max_model_len = 128;
  c.kv_cache_tokens = 8 * 128;
  Engine e(be, c);
  std::vector<std::shared_ptr<RequestStream>> ss;
  for (int i = 0; i < 8; ++i) {
    SamplingParams sp;
    sp.temperature = i % 2 ? 0.8f : 0.0f;
    sp.seed = 100 + i;
    sp.max_tokens = 12;
    sp.ignore_eos = true;
    std::vector<int32_t> p;
    for (int k = 0; k < 5 + 3 * i; ++k) p.push_back((k * 31 + i * 17 + 3) % 500);
    ss.push_back(e.submit(p, sp));
  }
  while (e.step()) {
  }
  std::vector<std::vector<int32_t>> out(ss.size());
  for (size_t i = 0; i < ss.size(); ++i)
    while (auto ev = ss[i]->next(std::chrono::milliseconds(0))) {
      EXPECT_TRUE(ev->error.empty()) << ev->error;
      out[i].insert(out[i].end(), ev->tokens.begin(), ev->tokens.end());
    }
  return out;
}

TEST(TpCpu, EngineOverTp2GivesTp1Tokens) {
  auto one = backend(kTiny, 1);
  auto want = serve(*one);
  for (ExpertSharding s : {ExpertSharding::kIntermediate, ExpertSharding::kExpertParallel}) {
    auto two = backend(kTiny, 2, s);
    auto got = serve(*two);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(int(want[i].size()), 12);
      EXPECT_EQ(got[i], want[i]) << "request " << i << " " << expert_sharding_name(s);
    }
  }
}

// A rank backend that fails its `fail_at`-th forward pass (before any collective: its peers
// are left waiting in one) and reports a fixed KV budget.
class FlakyRank final : public Backend {
 public:
  FlakyRank(std::unique_ptr<Backend> in, int fail_at, size_t kv_bytes)
      : in_(std::move(in)), fail_at_(fail_at), kv_bytes_(kv_bytes) {}
  std::string name() const override { return in_->name(); }
  const GptOssConfig& config() const override { return in_->config(); }
  void init_kv_cache(const KvCacheConfig& kv) override { in_->init_kv_cache(kv); }
  const KvCacheConfig& kv_config() const override { return in_->kv_config(); }
  void forward(const ForwardBatch& b, float* l) override {
    if (++calls_ == fail_at_) throw Error("injected failure");
    in_->forward(b, l);
  }
  size_t kv_memory_available() const override { return kv_bytes_; }

 private:
  std::unique_ptr<Backend> in_;
  int fail_at_, calls_ = 0;
  size_t kv_bytes_;
};

TEST(TpCpu, FailingRankTakesTheGroupDownWithoutAHang) {
  auto w = ModelWeights::load(real_shape_model());
  auto comms = std::make_shared<std::vector<std::unique_ptr<Communicator>>>(make_local_communicators(2));
  auto be = make_tp_backend(2, 2, [=](int r) {
    TpRank t;
    t.comm = std::move((*comms)[r]);
    auto cpu = make_cpu_backend(w, 1, TpShard{r, 2}, t.comm.get());
    t.backend = std::make_unique<FlakyRank>(std::move(cpu), r == 1 ? 3 : 0, r == 0 ? 4000 : 3000);
    return t;
  });
  // Each rank holds 4 of the 8 kv heads: 3000 bytes of rank 1's are 6000 of the whole model's.
  EXPECT_EQ(be->kv_memory_available(), size_t(6000));
  const auto prompt = prompt_for(be->config(), 5);
  run(*be, prompt, 0, false);  // 1 forward
  // A malformed batch is refused before the ranks see it: the group lives on.
  ForwardBatch bad;
  bad.tokens = {int32_t(be->config().vocab)};
  std::vector<float> l(be->config().vocab);
  EXPECT_THROW(be->forward(bad, l.data()), Error);
  run(*be, prompt, 0, false);  // 2
  try {
    run(*be, prompt, 0, false);  // 3: rank 1 fails while rank 0 waits in the all-reduce
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor-parallel rank 1: injected failure"), std::string::npos) << e.what();
  }
  try {
    run(*be, prompt, 0, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group is down"), std::string::npos) << e.what();
  }
}

// ---- the launcher's process group: real gptoss processes ----

using test::free_port;

struct Proc {
  pid_t pid = -1;
  std::string out, err;  // files
};

// Starts gptoss with `args`, the environment minus any launcher variables plus `env`.
Proc start(const std::vector<std::string>& args, const std::vector<std::string>& env, const std::string& name) {
  static const char* kLauncherVars[] = {"RANK=",    "WORLD_SIZE=",      "LOCAL_RANK=",   "MASTER_ADDR=",
                                        "MASTER_PORT=", "TORCHELASTIC_", "GPTOSS_TP_PORT=", "SLURM_",
                                        "OMPI_COMM_WORLD_"};
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    bool drop = false;
    for (const char* v : kLauncherVars) drop |= std::strncmp(*e, v, std::strlen(v)) == 0;
    if (!drop) envs.push_back(*e);
  }
  envs.insert(envs.end(), env.begin(), env.end());
  Proc p;
  const std::string dir = test::temp_dir("tp-proc-" + name);
  p.out = dir + "/stdout";
  p.err = dir + "/stderr";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> argv_s = {kGptoss};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  EXPECT_EQ(posix_spawn(&p.pid, kGptoss.c_str(), &fa, nullptr, argv.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&fa);
  return p;
}

int wait_exit(const Proc& p) {
  int status = 0;
  waitpid(p.pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

std::vector<std::string> generate_args(const std::vector<std::string>& extra) {
  std::vector<std::string> a = {"generate", "--model", kTiny, "--prompt-ids", "5,17,300,42,7,99,1,250", "--max-tokens",
                                "16", "--ignore-eos", "--print-ids", "--threads", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Rank r's environment as `launcher` sets it.
std::vector<std::string> launcher_env(const std::string& launcher, int rank, int world, int port) {
  const std::string r = std::to_string(rank), w = std::to_string(world);
  std::vector<std::string> e = {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)};
  if (launcher == "torchrun")  // torchrun's agent holds MASTER_PORT: gptoss meets on the next one
    e.insert(e.end(), {"RANK=" + r, "WORLD_SIZE=" + w, "LOCAL_RANK=" + r, "TORCHELASTIC_RUN_ID=test"});
  if (launcher == "kubernetes") e.insert(e.end(), {"RANK=" + r, "WORLD_SIZE=" + w});
  if (launcher == "slurm") e.insert(e.end(), {"SLURM_PROCID=" + r, "SLURM_NTASKS=" + w, "SLURM_LOCALID=" + r});
  if (launcher == "openmpi")
    e.insert(e.end(), {"OMPI_COMM_WORLD_RANK=" + r, "OMPI_COMM_WORLD_SIZE=" + w, "OMPI_COMM_WORLD_LOCAL_RANK=" + r});
  return e;
}

TEST(TpProcesses, TwoProcessesGiveTp1Tokens) {
  Proc ref = start(generate_args({}), {}, "ref");
  ASSERT_EQ(wait_exit(ref), 0) << slurp(ref.err);
  const std::string want = slurp(ref.out);
  ASSERT_NE(want.find(','), std::string::npos) << want;
  for (std::string launcher : {"torchrun", "kubernetes", "slurm", "openmpi"}) {
    const int port = free_port();
    const std::vector<std::string> tp = {"--tp", "2", "--tp-expert-sharding",
                                         launcher == "slurm" ? "expert" : "intermediate"};
    // The worker first: it retries until rank 0 listens.
    Proc w = start(generate_args(tp), launcher_env(launcher, 1, 2, port), launcher + "-1");
    Proc r0 = start(generate_args(tp), launcher_env(launcher, 0, 2, port), launcher + "-0");
    EXPECT_EQ(wait_exit(r0), 0) << launcher << ": " << slurp(r0.err);
    EXPECT_EQ(wait_exit(w), 0) << launcher << ": rank 0 stopping must stop the worker cleanly: " << slurp(w.err);
    EXPECT_EQ(slurp(r0.out), want) << launcher;
    EXPECT_EQ(slurp(w.out), "") << "a worker prints nothing of the command's";
  }
}

TEST(TpProcesses, KilledWorkerIsAClearErrorOnRank0) {
  const int port = free_port();
  const std::vector<std::string> tp = {"--tp", "2"};
  auto env1 = launcher_env("torchrun", 1, 2, port);
  env1.push_back("GPTOSS_TP_TEST_DIE_AT_CALL=4");  // init, prefill, 1st decode, then killed
  Proc w = start(generate_args(tp), env1, "die-1");
  Proc r0 = start(generate_args(tp), launcher_env("torchrun", 0, 2, port), "die-0");
  EXPECT_EQ(wait_exit(r0), 1);
  EXPECT_EQ(wait_exit(w), 128 + SIGKILL);
  const std::string err = slurp(r0.err);
  EXPECT_NE(err.find("tensor-parallel rank 1 closed its connection"), std::string::npos) << err;
}

TEST(TpProcesses, LauncherErrors) {
  // WORLD_SIZE and --tp disagree.
  Proc a = start(generate_args({"--tp", "2"}), launcher_env("torchrun", 0, 4, free_port()), "mismatch");
  EXPECT_EQ(wait_exit(a), 1);
  EXPECT_NE(slurp(a.err).find("torchrun started 4 processes but --tensor-parallel-size is 2"), std::string::npos)
      << slurp(a.err);
  // No MASTER_ADDR.
  Proc b = start(generate_args({"--tp", "2"}), {"RANK=1", "WORLD_SIZE=2"}, "noaddr");
  EXPECT_EQ(wait_exit(b), 1);
  EXPECT_NE(slurp(b.err).find("without MASTER_ADDR"), std::string::npos) << slurp(b.err);
  // A worker whose rank 0 never comes: gives up at its deadline, naming the address.
  auto env = launcher_env("torchrun", 1, 2, free_port());
  env.push_back("GPTOSS_TP_CONNECT_TIMEOUT_S=1");
  Proc c = start(generate_args({"--tp", "2"}), env, "norank0");
  EXPECT_EQ(wait_exit(c), 1);
  EXPECT_NE(slurp(c.err).find("could not reach rank 0 at 127.0.0.1"), std::string::npos) << slurp(c.err);
}

}  // namespace
}  // namespace gptoss
