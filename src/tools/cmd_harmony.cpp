// `gptoss harmony-render`: a Chat Completions request (JSON) -> the harmony prompt the server
// would render (text or ids).
// `gptoss harmony-parse`: sampled ids (a JSON array per line) -> the parsed messages (JSON).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "server/chat_format.h"
#include "server/openai_api.h"
#include "tokenizer/harmony.h"
#include "tools/command.h"
#include "tools/json_lines.h"
#include "tools/options.h"
#include "tools/prompt_ids.h"

namespace {

using gptoss::harmony::Role;

gptoss::Tokenizer load(const std::string& path) {
  return path.empty() ? gptoss::Tokenizer::o200k_harmony() : gptoss::Tokenizer::from_file(path);
}

std::string slurp(const std::string& path) {
  if (path == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  return gptoss::read_regular_file(path);
}

gptoss::tools::RegisterCommand reg_render(
    {"harmony-render", "Render a Chat Completions request (JSON) as the harmony prompt",
     [](CLI::App* sub) {
       auto path = std::make_shared<std::string>();
       auto request = std::make_shared<std::string>("-");
       auto ids = std::make_shared<bool>(false);
       auto date = std::make_shared<std::string>();
       auto jsonl = std::make_shared<bool>(false);
       gptoss::tools::add_tokenizer_option(sub, *path);
       sub->add_option("--request", *request, "Request JSON file ('-': stdin)")->check(gptoss::tools::non_empty());
       sub->add_option("--date", *date, "Current date for the system message, YYYY-MM-DD (e.g. 2025-06-28)")
           ->check(gptoss::tools::iso_date());
       sub->add_flag("--ids", *ids, "Print token ids (a JSON array) instead of text");
       sub->add_flag("--jsonl", *jsonl,
                     "Many requests, one JSON object a line; print one JSON value a line "
                     "(the text as a JSON string, or the ids)");
       return [=]() {
         std::optional<gptoss::harmony::Renderer> renderer;
         if (*ids) renderer.emplace(load(*path));
         // The same mapping the server applies to /v1/chat/completions.
         auto render = [&](const std::string& body) {
           gptoss::server::ChatRequest req;
           try {
             req = gptoss::server::parse_chat_request(gptoss::server::parse_body(body));
           } catch (const gptoss::server::ApiError& e) {
             throw gptoss::Error("harmony-render: " + e.message);
           }
           auto conv = gptoss::server::build_conversation(req);
           if (!date->empty())
             std::get<gptoss::harmony::SystemContent>(conv.messages.at(0).content.at(0)).conversation_start_date = *date;
           if (*ids) return nlohmann::json(renderer->render_for_completion(conv)).dump();
           std::string text = gptoss::harmony::render_text_for_completion(conv);
           return *jsonl ? nlohmann::json(text).dump() : text;
         };
         if (!*jsonl) {
           std::printf("%s\n", render(slurp(*request)).c_str());
           return 0;
         }
         // Batch mode (the built-in model's training data renders thousands of requests).
         std::istringstream in(slurp(*request));
         std::string line;
         size_t line_no = 0;
         while (std::getline(in, line)) {
           ++line_no;
           if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
           try {
             std::printf("%s\n", render(line).c_str());
           } catch (const gptoss::Error& e) {
             throw gptoss::Error("line " + std::to_string(line_no) + ": " + e.what());
           }
         }
         return 0;
       };
     }});

gptoss::tools::RegisterCommand reg_parse(
    {"harmony-parse", "Parse sampled token ids (JSON arrays, one a line) into harmony messages",
     [](CLI::App* sub) {
       auto path = std::make_shared<std::string>();
       auto no_role = std::make_shared<bool>(false);
       auto lenient = std::make_shared<bool>(false);
       gptoss::tools::add_tokenizer_option(sub, *path);
       sub->add_flag("--with-start", *no_role,
                     "The ids begin with <|start|> (default: they follow '<|start|>assistant')");
       sub->add_flag("--lenient", *lenient, "Non-strict parsing of malformed headers");
       return [=]() {
         auto tok = load(*path);
         gptoss::tools::for_each_json_line(std::cin, "harmony-parse", [&](const nlohmann::json& v, const std::string& where) {
           const auto ids = gptoss::tools::ids_of_json_array(v, where);
           for (auto id : ids)
             if (!tok.has_token(id)) throw gptoss::Error(where + ": unknown token id " + std::to_string(id));
           auto msgs = gptoss::harmony::parse_completion(
               tok, ids, *no_role ? std::nullopt : std::optional<Role>(Role::Assistant),
               gptoss::harmony::ParseOptions{!*lenient});
           nlohmann::ordered_json out = nlohmann::ordered_json::array();
           for (const auto& m : msgs) {
             nlohmann::ordered_json j;
             j["role"] = std::string(gptoss::harmony::role_name(m.role));
             if (m.name) j["name"] = *m.name;
             if (m.recipient) j["recipient"] = *m.recipient;
             if (m.channel) j["channel"] = *m.channel;
             if (m.content_type) j["content_type"] = *m.content_type;
             j["content"] = m.text_content();
             out.push_back(j);
           }
           std::printf("%s\n", out.dump().c_str());
           std::fflush(stdout);
         });
         return 0;
       };
     }});

}  // namespace
