#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace gptoss::test {

inline double rel_error(const float* a, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i])) return INFINITY;
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// A fresh empty directory under the test temp dir.
inline std::string temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("gptoss-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace gptoss::test
