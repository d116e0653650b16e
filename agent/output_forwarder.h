// OutputForwarder: copies a child's output pipe to one of the agent's descriptors, one line at
// a time, each prefixed with "[<worker id>] ", written with a single write(2) so lines of
// different workers never interleave inside a line.
//
// Lives on the agent's event loop (asio, one thread). Start() keeps the forwarder alive
// (shared_from_this) until the pipe reaches EOF, i.e. until the child and everything that
// inherited the pipe are gone, so output written just before a crash is not lost. An unfinished
// last line is flushed at EOF. Lines longer than 64 KiB are split.
#pragma once

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <memory>
#include <string>

namespace pacer {

class OutputForwarder : public std::enable_shared_from_this<OutputForwarder> {
 public:
  // Takes ownership of `pipe_fd`; writes to `sink_fd` (not owned, e.g. 1 or 2).
  static std::shared_ptr<OutputForwarder> Start(boost::asio::io_context& io, int pipe_fd,
                                                int sink_fd, std::string prefix);

 private:
  OutputForwarder(boost::asio::io_context& io, int pipe_fd, int sink_fd, std::string prefix);
  void ReadMore();
  void Emit(std::string_view line);

  boost::asio::posix::stream_descriptor pipe_;
  int sink_fd_;
  std::string prefix_;
  std::array<char, 8192> buf_;
  std::string partial_;
};

}  // namespace pacer
