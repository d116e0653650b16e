// TestPki: certificates for TLS tests, made by the openssl command line in a test's temp dir:
// a CA, server certificates it signs (SAN localhost, 127.0.0.1, pacerd.test), a client
// certificate for mTLS, and an unrelated CA whose certificates nobody trusts. EC P-256 keys, so
// making them takes milliseconds.
#pragma once

#include <string>

#include "tests/testing/test_util.h"

namespace pacer::testing {

struct CertFiles {
  std::string cert, key;
};

class TestPki {
 public:
  // Makes the CA, server "server-a", client "client-w0" and the foreign CA under dir/pki.
  // A gtest failure (with openssl's output) when openssl fails.
  explicit TestPki(const TempDir& dir);

  const std::string& ca() const { return ca_.cert; }
  const CertFiles& server() const { return server_; }
  const CertFiles& client() const { return client_; }
  const CertFiles& foreign_client() const { return foreign_client_; }  // signed by the other CA

  // A new certificate signed by the CA with common name `cn` (and the server SANs), in new
  // files under dir/pki.
  CertFiles Issue(const std::string& cn, bool server_names = true);

 private:
  CertFiles IssueBy(const CertFiles& ca, const std::string& cn, bool server_names);
  std::string dir_;
  int serial_ = 1;
  CertFiles ca_, foreign_ca_, server_, client_, foreign_client_;
};

// Replaces `to`'s certificate and key with `from`'s, each by an atomic rename (key first).
void InstallCert(const CertFiles& from, const CertFiles& to);

}  // namespace pacer::testing
