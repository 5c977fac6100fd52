#pragma once
// Stored responses of /v1/responses (store: true), in an SQLite database so they outlive the
// server: `previous_response_id` continues a stored conversation, GET/DELETE
// /v1/responses/{id} read and remove one. Thread-safe (one connection behind a mutex).
#include <nlohmann/json.hpp>

#include <memory>
#include <mutex>
#include <optional>
#include <string>

struct sqlite3;

namespace gptoss::server {

struct StoredResponse {
  nlohmann::json response;      // the response object as answered
  nlohmann::ordered_json items;  // the whole conversation as Responses items: inputs, then outputs
};

class ResponseStore {
 public:
  // `path` "" or ":memory:": a private in-memory database (tests). Otherwise the file is
  // created with its parent directories. Throws gptoss::Error when it cannot be opened.
  explicit ResponseStore(const std::string& path);
  ~ResponseStore();
  ResponseStore(const ResponseStore&) = delete;
  ResponseStore& operator=(const ResponseStore&) = delete;

  void put(const std::string& id, const StoredResponse& r);
  std::optional<StoredResponse> get(const std::string& id);
  bool remove(const std::string& id);  // false: no such response
  const std::string& path() const { return path_; }

 private:
  void exec(const char* sql);
  std::string path_;
  sqlite3* db_ = nullptr;
  std::mutex mu_;
};

}  // namespace gptoss::server
