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
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status s = methods->GetSendStatus();
      if (unparsable_ && s.error_code() == grpc::StatusCode::UNIMPLEMENTED && s.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            std::string(method_) + ": the request body is not a valid request message of this "
                                   "method (a client built from another .proto, or corrupted bytes)"));
      } else if (s.error_message().size() > kMaxStatusMessageBytes) {
        methods->ModifySendStatus(
            grpc::Status(s.error_code(), BoundStatusMessage(s.error_message()), s.error_details()));
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

std::string BoundStatusMessage(std::string_view message) {
  if (message.size() <= kMaxStatusMessageBytes) return std::string(message);
  auto continuation = [&](size_t i) { return (static_cast<unsigned char>(message[i]) & 0xC0) == 0x80; };
  size_t head = kMaxStatusMessageBytes * 3 / 4;
  while (head > 0 && continuation(head)) --head;
  size_t tail = message.size() - kMaxStatusMessageBytes / 8;
  while (tail < message.size() && continuation(tail)) ++tail;
  return std::string(message.substr(0, head)) + " [... " + std::to_string(tail - head) +
         " bytes cut ...] " + std::string(message.substr(tail));
}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
UnparsableRequestInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> v;
  v.push_back(std::make_unique<Factory>());
  return v;
}

}  // namespace pacer
