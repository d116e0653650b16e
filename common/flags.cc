#include "common/flags.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <typeinfo>

#include "common/version.h"

namespace po = boost::program_options;

namespace pacer {
namespace {

bool IsUnsigned(const std::type_info& t) {
  return t == typeid(unsigned char) || t == typeid(unsigned short) || t == typeid(unsigned) ||
         t == typeid(unsigned long) || t == typeid(unsigned long long);
}

// The checks every numeric flag of every binary needs, whatever it means: boost parses "-1" into
// an unsigned flag as 2^64 - 1 (a wrapped limit, silently), and "nan" / "inf" into a double.
void CheckNumbers(const std::string& program, const po::parsed_options& parsed,
                  const po::variables_map& vm) {
  for (const po::option& opt : parsed.options) {
    if (opt.string_key.empty() || opt.string_key == "pacer-positional" || !vm.count(opt.string_key)) {
      continue;
    }
    const boost::any& v = vm[opt.string_key].value();
    const std::string given = opt.value.empty() ? "" : opt.value.front();
    if (IsUnsigned(v.type()) && given.find('-') != std::string::npos) {
      ExitWithError(program, "--" + opt.string_key + " must be a number >= 0, not '" + given + "'");
    }
    double d = 0;
    if (v.type() == typeid(double)) d = boost::any_cast<double>(v);
    if (v.type() == typeid(float)) d = boost::any_cast<float>(v);
    if (!std::isfinite(d)) {
      ExitWithError(program, "--" + opt.string_key + " must be a finite number, not '" + given + "'");
    }
  }
}

}  // namespace

void ExitWithError(const std::string& program, const std::string& message, int code) {
  std::cerr << program << ": " << message << std::endl;
  std::exit(code);
}

ParsedFlags ParseFlagsOrExit(int argc, char** argv, const std::string& usage,
                             const po::options_description& options, bool allow_positional) {
  std::string program = argc > 0 ? argv[0] : "pacer";
  if (auto slash = program.rfind('/'); slash != std::string::npos) program = program.substr(slash + 1);

  ParsedFlags out;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      for (int j = i + 1; j < argc; ++j) out.passthrough.emplace_back(argv[j]);
      break;
    }
    args.push_back(std::move(a));
  }
  po::options_description all;
  all.add(options);
  po::options_description common("Every Pacer binary");
  common.add_options()("help,h", "print this help and exit");
  common.add_options()("version", "print the version and exit");
  all.add(common);
  all.add_options()("pacer-positional", po::value<std::vector<std::string>>(), "");
  po::positional_options_description pos;
  pos.add("pacer-positional", -1);
  try {
    po::parsed_options parsed = po::command_line_parser(args).options(all).positional(pos).run();
    po::store(parsed, out.vm);
    CheckNumbers(program, parsed, out.vm);
    if (out.vm.count("help")) {
      std::cout << usage << "\n\n" << options << "\n" << common << std::endl;
      std::exit(0);
    }
    if (out.vm.count("version")) {
      std::cout << program << " " << PacerVersion() << std::endl;
      std::exit(0);
    }
    po::notify(out.vm);
  } catch (const po::error& e) {
    ExitWithError(program, std::string(e.what()) + " (see --help)");
  }
  if (out.vm.count("pacer-positional")) {
    out.positional = out.vm["pacer-positional"].as<std::vector<std::string>>();
  }
  if (!allow_positional && !out.positional.empty()) {
    ExitWithError(program, "unexpected argument '" + out.positional.front() + "' (see --help)");
  }
  return out;
}

}  // namespace pacer
