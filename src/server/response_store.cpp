#include "server/response_store.h"

#include <sqlite3.h>

#include <ctime>
#include <filesystem>

#include "common/error.h"

namespace gptoss::server {

namespace {

// A prepared statement that finalizes itself.
struct Stmt {
  sqlite3_stmt* s = nullptr;
  Stmt(sqlite3* db, const char* sql) {
    if (sqlite3_prepare_v2(db, sql, -1, &s, nullptr) != SQLITE_OK)
      throw Error(std::string("response store: ") + sqlite3_errmsg(db));
  }
  ~Stmt() { sqlite3_finalize(s); }
  void text(int i, const std::string& v) { sqlite3_bind_text(s, i, v.data(), int(v.size()), SQLITE_TRANSIENT); }
};

}  // namespace

ResponseStore::ResponseStore(const std::string& path) : path_(path.empty() ? ":memory:" : path) {
  if (path_ != ":memory:") {
    std::error_code ec;
    auto parent = std::filesystem::path(path_).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  }
  if (sqlite3_open_v2(path_.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw Error("cannot open the response store " + path_ + ": " + msg);
  }
  sqlite3_busy_timeout(db_, 5000);  // another server on the same file
  try {
    exec("PRAGMA journal_mode=WAL");
    // Writes happen on the HTTP event loop as a response finishes: no fsync per write (WAL keeps
    // the file consistent; a power cut may lose the last few responses, never corrupt the rest).
    exec("PRAGMA synchronous=NORMAL");
    exec("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, created_at INTEGER NOT NULL, "
         "response TEXT NOT NULL, items TEXT NOT NULL)");
  } catch (...) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
}

ResponseStore::~ResponseStore() { sqlite3_close(db_); }

void ResponseStore::exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "error";
    sqlite3_free(err);
    throw Error("response store " + path_ + ": " + msg);
  }
}

void ResponseStore::put(const std::string& id, const StoredResponse& r) {
  std::lock_guard lk(mu_);
  Stmt st(db_, "INSERT OR REPLACE INTO responses (id, created_at, response, items) VALUES (?, ?, ?, ?)");
  st.text(1, id);
  sqlite3_bind_int64(st.s, 2, int64_t(std::time(nullptr)));
  st.text(3, r.response.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  st.text(4, r.items.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  if (sqlite3_step(st.s) != SQLITE_DONE) throw Error(std::string("response store: ") + sqlite3_errmsg(db_));
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) {
  std::lock_guard lk(mu_);
  Stmt st(db_, "SELECT response, items FROM responses WHERE id = ?");
  st.text(1, id);
  int rc = sqlite3_step(st.s);
  if (rc == SQLITE_DONE) return std::nullopt;
  if (rc != SQLITE_ROW) throw Error(std::string("response store: ") + sqlite3_errmsg(db_));
  auto col = [&](int i) {
    const unsigned char* t = sqlite3_column_text(st.s, i);
    return std::string(t ? reinterpret_cast<const char*>(t) : "", size_t(sqlite3_column_bytes(st.s, i)));
  };
  StoredResponse r;
  r.response = nlohmann::json::parse(col(0));
  r.items = nlohmann::ordered_json::parse(col(1));
  return r;
}

bool ResponseStore::remove(const std::string& id) {
  std::lock_guard lk(mu_);
  Stmt st(db_, "DELETE FROM responses WHERE id = ?");
  st.text(1, id);
  if (sqlite3_step(st.s) != SQLITE_DONE) throw Error(std::string("response store: ") + sqlite3_errmsg(db_));
  return sqlite3_changes(db_) > 0;
}

}  // namespace gptoss::server
