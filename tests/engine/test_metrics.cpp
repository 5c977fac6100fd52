// Prometheus histogram semantics of engine/metrics: cumulative buckets, +Inf == _count, _sum,
// the labels on every series.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "engine/metrics.h"
#include "prometheus_text.h"

using namespace gptoss;

namespace {

// "series{labels} value" lines of one rendering, keyed by everything before the value.
std::map<std::string, double> series(const std::string& text) { return promtest::parse_samples(text); }

}  // namespace

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1.0, 10.0});
  for (double v : {0.05, 0.1, 0.5, 2.0, 3.0, 50.0}) h.observe(v);  // 0.1 is in le="0.1" (<=)
  std::string text;
  h.render("x_seconds", "help", text, "model_name=\"m\"");
  auto s = series(text);
  EXPECT_EQ(s.at("x_seconds_bucket{model_name=\"m\",le=\"0.1\"}"), 2);
  EXPECT_EQ(s.at("x_seconds_bucket{model_name=\"m\",le=\"1\"}"), 3);
  EXPECT_EQ(s.at("x_seconds_bucket{model_name=\"m\",le=\"10\"}"), 5);
  EXPECT_EQ(s.at("x_seconds_bucket{model_name=\"m\",le=\"+Inf\"}"), 6);
  EXPECT_EQ(s.at("x_seconds_count{model_name=\"m\"}"), 6);
  EXPECT_DOUBLE_EQ(s.at("x_seconds_sum{model_name=\"m\"}"), 0.05 + 0.1 + 0.5 + 2.0 + 3.0 + 50.0);
  EXPECT_EQ(h.count(), 6u);
  EXPECT_NE(text.find("# TYPE x_seconds histogram"), std::string::npos);
  // Without labels: plain series names.
  std::string bare;
  h.render("y", "help", bare);
  auto b = series(bare);
  EXPECT_EQ(b.at("y_bucket{le=\"+Inf\"}"), 6);
  EXPECT_EQ(b.at("y_count"), 6);
}
