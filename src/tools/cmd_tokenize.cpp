// `gptoss tokenize`: JSON lines in, JSON lines out (the interface of tests/tools/o200k-oracle).
//   echo '"hello world"' | gptoss tokenize --tokenizer PATH            -> [24912,2375]
//   echo '[24912,2375]'  | gptoss tokenize --tokenizer PATH --decode   -> "hello world"
// Encoding recognises special tokens in the text. `gptoss tokenize-bench` times encoding.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "tokenizer/tokenizer.h"
#include "tools/command.h"
#include "tools/json_lines.h"
#include "tools/options.h"
#include "tools/prompt_ids.h"

namespace {

gptoss::Tokenizer load(const std::string& path) {
  return path.empty() ? gptoss::Tokenizer::o200k_harmony() : gptoss::Tokenizer::from_file(path);
}

gptoss::tools::RegisterCommand reg_tokenize(
    {"tokenize", "Encode JSON-lines text to token ids (or --decode ids to text)",
     [](CLI::App* sub) {
       auto path = std::make_shared<std::string>();
       auto decode = std::make_shared<bool>(false);
       auto no_special = std::make_shared<bool>(false);
       gptoss::tools::add_tokenizer_option(sub, *path);
       sub->add_flag("--decode", *decode, "Read JSON arrays of ids, write JSON strings");
       sub->add_flag("--no-special", *no_special, "Encode special-token text as ordinary text");
       return [=]() {
         auto tok = load(*path);
         gptoss::tools::for_each_json_line(std::cin, "tokenize", [&](const nlohmann::json& v, const std::string& where) {
           std::string out;
           if (*decode) {
             const std::vector<gptoss::TokenId> ids = gptoss::tools::ids_of_json_array(v, where);
             try {
               out = nlohmann::json(tok.decode(ids)).dump();
             } catch (const gptoss::Error& e) {
               throw gptoss::Error(where + ": " + e.what());
             }
           } else {
             std::string text;
             if (v.is_string())
               text = v.get<std::string>();
             else if (v.is_object() && v.contains("text") && v["text"].is_string())
               text = v["text"].get<std::string>();
             else
               throw gptoss::Error(where + ": expected a JSON string or {\"text\": ...}");
             auto ids = tok.encode(text, !*no_special);
             out.reserve(ids.size() * 7 + 2);
             out += '[';
             for (size_t i = 0; i < ids.size(); ++i) {
               if (i) out += ',';
               out += std::to_string(ids[i]);
             }
             out += ']';
           }
           out += '\n';
           std::fwrite(out.data(), 1, out.size(), stdout);
           std::fflush(stdout);
         });
         return 0;
       };
     }});

gptoss::tools::RegisterCommand reg_bench(
    {"tokenize-bench", "Encode throughput (MB/s, one thread) on a text file",
     [](CLI::App* sub) {
       auto path = std::make_shared<std::string>();
       auto file = std::make_shared<std::string>();
       auto seconds = std::make_shared<double>(3.0);
       gptoss::tools::add_tokenizer_option(sub, *path);
       sub->add_option("--file", *file, "UTF-8 text to encode")->required();
       sub->add_option("--seconds", *seconds, "Time to spend (default 3)")->check(gptoss::tools::positive_number());
       return [=]() {
         auto tok = load(*path);
         std::string text = gptoss::read_regular_file(*file);
         using clock = std::chrono::steady_clock;
         size_t tokens = tok.encode(text).size();  // warm-up
         size_t bytes = 0, iters = 0;
         auto t0 = clock::now();
         double el = 0;
         do {
           tokens = tok.encode(text).size();
           bytes += text.size();
           ++iters;
           el = std::chrono::duration<double>(clock::now() - t0).count();
         } while (el < *seconds);
         std::printf("text: %zu bytes, %zu tokens; %zu passes in %.2f s: %.2f MB/s\n",
                     text.size(), tokens, iters, el, bytes / el / 1e6);
         return 0;
       };
     }});

}  // namespace
