#include "agent/output_forwarder.h"

#include <unistd.h>

#include <boost/asio/read.hpp>

namespace pacer {

constexpr size_t kMaxLine = 64 * 1024;

std::shared_ptr<OutputForwarder> OutputForwarder::Start(boost::asio::io_context& io, int pipe_fd,
                                                        int sink_fd, std::string prefix) {
  std::shared_ptr<OutputForwarder> f(new OutputForwarder(io, pipe_fd, sink_fd, std::move(prefix)));
  f->ReadMore();
  return f;
}

OutputForwarder::OutputForwarder(boost::asio::io_context& io, int pipe_fd, int sink_fd,
                                 std::string prefix)
    : pipe_(io, pipe_fd), sink_fd_(sink_fd), prefix_(std::move(prefix)) {}

void OutputForwarder::Emit(std::string_view line) {
  std::string out;
  out.reserve(prefix_.size() + line.size() + 1);
  out.append(prefix_).append(line).push_back('\n');
  size_t off = 0;
  while (off < out.size()) {
    ssize_t n = write(sink_fd_, out.data() + off, out.size() - off);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;  // the agent's own output is gone; drop the line
    }
    off += static_cast<size_t>(n);
  }
}

void OutputForwarder::ReadMore() {
  pipe_.async_read_some(
      boost::asio::buffer(buf_),
      [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
        self->partial_.append(self->buf_.data(), n);
        size_t start = 0;
        for (size_t nl; (nl = self->partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
          self->Emit(std::string_view(self->partial_).substr(start, nl - start));
        }
        self->partial_.erase(0, start);
        while (self->partial_.size() >= kMaxLine) {
          self->Emit(std::string_view(self->partial_).substr(0, kMaxLine));
          self->partial_.erase(0, kMaxLine);
        }
        if (ec) {  // EOF or error: flush and stop (the descriptor closes with us)
          if (!self->partial_.empty()) self->Emit(self->partial_);
          self->partial_.clear();
          return;
        }
        self->ReadMore();
      });
}

}  // namespace pacer
