#include "common/grpc_errors.h"

#include <string>

namespace pacer {
namespace {

using grpc::experimental::InterceptionHookPoints;

class UnparsableRequest final : public grpc::experimental::Interceptor {
 public:
  explicit UnparsableRequest(grpc::experimental::ServerRpcInfo* info) : method_(info->method()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsable_ = true;  // the body did not deserialize into the method's request message
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) && unparsable_) {
      const grpc::Status s = methods->GetSendStatus();
      if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED && s.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            std::string(method_) + ": the request body is not a valid request message of this "
                                   "method (a client built from another .proto, or corrupted bytes)"));
      }
    }
    methods->Proceed();
  }

 private:
  const char* method_;
  bool unparsable_ = false;
};

class Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new UnparsableRequest(info);
  }
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
UnparsableRequestInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> v;
  v.push_back(std::make_unique<Factory>());
  return v;
}

}  // namespace pacer
