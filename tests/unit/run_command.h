// Runs a shell command for end-to-end tests: exit code and combined output.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "mm_test_paths.h"

namespace mm::test {

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed, like a shell
  std::string output;  // stdout and stderr
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  std::string full = "( " + cmd + " ) 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = pclose(p);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) r.exit_code = 128 + WTERMSIG(status);
  return r;
}

inline std::string mm_binary() { return MM_BINARY; }

// A loopback port for a test's TCPStore: one the kernel just handed out as free (bound to port 0
// and closed), so concurrent tests do not pick the same one (a fixed pid-based choice collided in
// CI: EADDRINUSE). The pid-based choice remains the fallback.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      const int port = ntohs(addr.sin_port);
      ::close(fd);
      return port;
    }
    ::close(fd);
  }
  return 20000 + static_cast<int>(getpid() % 20000) + std::rand() % 1000;
}

// `mm launch` of n ranks on a fresh port; a long grace period lets the surviving ranks report
// their own error before the launcher stops them.
inline std::string mm_launch(int n) {
  return mm_binary() + " launch --grace 20 --nproc-per-node " + std::to_string(n) + " --master-port " +
         std::to_string(free_port()) + " -- ";
}
inline std::string source_dir() { return MM_SOURCE_DIR; }

// A fresh empty directory under the build tree for one test.
inline std::string fresh_dir(const std::string& name) {
  std::filesystem::path d = std::filesystem::path(MM_BUILD_DIR) / "test_tmp" / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace mm::test
