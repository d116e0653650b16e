#include "tests/tls/test_pki.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace pacer::testing {
namespace {

// Runs a shell command; its output goes to `log`. False (and a gtest failure) when it fails.
bool Run(const std::string& cmd, const std::string& log) {
  const int rc = std::system((cmd + " >>" + log + " 2>&1").c_str());
  EXPECT_EQ(rc, 0) << cmd << "\n" << ReadFileOrEmpty(log);
  return rc == 0;
}

const char* kEc = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

}  // namespace

TestPki::TestPki(const TempDir& dir) : dir_(dir.Sub("pki")) {
  std::filesystem::create_directories(dir_);
  auto make_ca = [&](const std::string& name) {
    CertFiles ca{dir_ + "/" + name + ".pem", dir_ + "/" + name + ".key"};
    Run(std::string("openssl req -x509 ") + kEc + " -days 2 -subj /CN=" + name + " -keyout " + ca.key +
            " -out " + ca.cert,
        dir_ + "/openssl.log");
    return ca;
  };
  ca_ = make_ca("pacer-test-ca");
  foreign_ca_ = make_ca("foreign-ca");
  server_ = Issue("server-a");
  client_ = Issue("client-w0", /*server_names=*/false);
  foreign_client_ = IssueBy(foreign_ca_, "intruder", false);
}

CertFiles TestPki::Issue(const std::string& cn, bool server_names) { return IssueBy(ca_, cn, server_names); }

CertFiles TestPki::IssueBy(const CertFiles& ca, const std::string& cn, bool server_names) {
  const std::string base = dir_ + "/" + cn + "-" + std::to_string(serial_);
  CertFiles out{base + ".pem", base + ".key"};
  const std::string ext = base + ".ext";
  std::ofstream(ext) << (server_names ? "subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:pacerd.test\n"
                                      : "extendedKeyUsage=clientAuth\n");
  const std::string log = dir_ + "/openssl.log";
  Run(std::string("openssl req ") + kEc + " -subj /CN=" + cn + " -keyout " + out.key + " -out " + base + ".csr",
      log);
  Run("openssl x509 -req -in " + base + ".csr -CA " + ca.cert + " -CAkey " + ca.key + " -set_serial " +
          std::to_string(1000 + serial_) + " -days 2 -extfile " + ext + " -out " + out.cert,
      log);
  ++serial_;
  return out;
}

void InstallCert(const CertFiles& from, const CertFiles& to) {
  for (const auto& [src, dst] : {std::pair{from.key, to.key}, std::pair{from.cert, to.cert}}) {
    const std::string tmp = dst + ".new";
    std::filesystem::copy_file(src, tmp, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(tmp, dst);
  }
}

}  // namespace pacer::testing
