// pacerctl's read commands: each fetches what it shows from pacerd and builds a View (the
// JSON / YAML document and the human table). `--watch` repeats them.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "cmd/pacerctl/dial.h"
#include "cmd/pacerctl/output.h"

namespace pacer::ctl {

struct Client {
  Target target;
  std::shared_ptr<grpc::Channel> channel;
};

// A read command: fills `view`, or returns the failed call's status and names it in `what`.
using ReadCommand = std::function<grpc::Status(const Client&, View* view, std::string* what)>;

grpc::Status StatusView(const Client& c, View* view, std::string* what);
grpc::Status DatasetsView(const Client& c, View* view, std::string* what);
grpc::Status WorkersView(const Client& c, View* view, std::string* what);
grpc::Status AgentsView(const Client& c, View* view, std::string* what);
grpc::Status ActionsView(const Client& c, View* view, std::string* what);
grpc::Status PolicyView(const Client& c, View* view, std::string* what);

// "straggler persistent contention node-level" from a classification.
std::string ClassText(int worker_class, int persistence, int cause, int scope);

}  // namespace pacer::ctl
