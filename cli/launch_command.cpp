// `mm launch --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P] -- CMD ...`
// Starts N local ranks of CMD with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), prefixes every output line with
// "[rank r] ", forwards SIGINT / SIGTERM to the ranks, and when one rank fails stops the others
// (SIGTERM, then SIGKILL after a grace period) and exits with that rank's code (128 + signal for
// a rank killed by a signal).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "mindspeed_mm/core/errors.h"

namespace mm::cli {
namespace {

struct LaunchArgs {
  int nproc_per_node = 1, nnodes = 1, node_rank = 0, master_port = 29500;
  double grace_s = 5;
  std::string master_addr = "127.0.0.1";
  std::vector<std::string> command;
} launch_args;

volatile std::sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

struct Child {
  pid_t pid = -1;
  int rank = 0, fd = -1;
  std::string pending;  // output not yet ended by a newline
  bool running = true;
  int status = 0;
};

void flush_lines(Child& c, bool all) {
  size_t start = 0;
  for (size_t nl; (nl = c.pending.find('\n', start)) != std::string::npos; start = nl + 1)
    std::printf("[rank %d] %s\n", c.rank, c.pending.substr(start, nl - start).c_str());
  c.pending.erase(0, start);
  if (all && !c.pending.empty()) {
    std::printf("[rank %d] %s\n", c.rank, c.pending.c_str());
    c.pending.clear();
  }
  std::fflush(stdout);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

int run_launch() {
  const LaunchArgs& a = launch_args;
  MM_CHECK(!a.command.empty(), "launch: give the command after --, e.g. mm launch --nproc-per-node 2 -- mm train cfg.yaml");
  MM_CHECK(a.nproc_per_node >= 1 && a.nnodes >= 1 && a.node_rank >= 0 && a.node_rank < a.nnodes,
           "launch: need --nproc-per-node >= 1 and 0 <= --node-rank < --nnodes");
  const int world = a.nproc_per_node * a.nnodes;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<Child> children(static_cast<size_t>(a.nproc_per_node));
  for (int lr = 0; lr < a.nproc_per_node; ++lr) {
    Child& c = children[static_cast<size_t>(lr)];
    c.rank = a.node_rank * a.nproc_per_node + lr;
    int fds[2];
    MM_CHECK(pipe(fds) == 0, "launch: pipe failed: ", std::strerror(errno));
    pid_t pid = fork();
    MM_CHECK(pid >= 0, "launch: fork failed: ", std::strerror(errno));
    if (pid == 0) {
      setpgid(0, 0);  // its own process group: stopping a rank stops what it started too
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      close(fds[1]);
      setenv("RANK", std::to_string(c.rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(lr).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(a.nproc_per_node).c_str(), 1);
      setenv("GROUP_RANK", std::to_string(a.node_rank).c_str(), 1);
      setenv("MASTER_ADDR", a.master_addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(a.master_port).c_str(), 1);
      setenv("OMP_NUM_THREADS", getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "1", 1);
      std::vector<char*> argv;
      for (const auto& s : a.command) argv.push_back(const_cast<char*>(s.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      std::fprintf(stderr, "error: launch: cannot run '%s': %s\n", argv[0], std::strerror(errno));
      _exit(127);
    }
    close(fds[1]);
    setpgid(pid, pid);
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    c.pid = pid;
    c.fd = fds[0];
  }

  int result = 0, failed_rank = -1;
  bool stopping = false;
  auto stop_at = std::chrono::steady_clock::time_point::max();
  auto stop_all = [&](int sig) {
    for (auto& c : children)
      if (c.running) kill(-c.pid, sig);
  };
  for (;;) {
    std::vector<pollfd> fds;
    for (auto& c : children)
      if (c.fd >= 0) fds.push_back({c.fd, POLLIN, 0});
    if (!fds.empty()) poll(fds.data(), fds.size(), 100);
    else usleep(100 * 1000);
    for (auto& c : children) {
      if (c.fd < 0) continue;
      char buf[4096];
      ssize_t n;
      while ((n = read(c.fd, buf, sizeof buf)) > 0) c.pending.append(buf, static_cast<size_t>(n));
      flush_lines(c, false);
      if (n == 0) {
        flush_lines(c, true);
        close(c.fd);
        c.fd = -1;
      }
    }
    if (g_signal && !stopping) {
      std::fprintf(stderr, "launch: got signal %d, passing it to the ranks\n", static_cast<int>(g_signal));
      stop_all(g_signal);
      stopping = true;
      result = 128 + g_signal;
      stop_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(a.grace_s * 1000));
    }
    bool any_running = false;
    for (auto& c : children) {
      if (!c.running) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.running = false;
        c.status = status;
        const int code = exit_code_of(status);
        if (code != 0 && failed_rank < 0 && !stopping) {
          failed_rank = c.rank;
          result = code;
          std::fprintf(stderr, "launch: rank %d exited with code %d; stopping the other ranks\n", c.rank, code);
          stop_all(SIGTERM);
          stopping = true;
          stop_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(a.grace_s * 1000));
        }
      } else {
        any_running = true;
      }
    }
    if (stopping && any_running && std::chrono::steady_clock::now() > stop_at) {
      std::fprintf(stderr, "launch: ranks still running after %.0f s; killing them\n", a.grace_s);
      stop_all(SIGKILL);
      stop_at = std::chrono::steady_clock::time_point::max();
    }
    bool open_pipes = false;
    for (auto& c : children) open_pipes |= c.fd >= 0;
    if (!any_running && !open_pipes) break;
    if (!any_running) {
      // Grandchildren may hold a pipe open; don't wait on them forever.
      for (auto& c : children)
        if (c.fd >= 0) {
          flush_lines(c, true);
          close(c.fd);
          c.fd = -1;
        }
      break;
    }
  }
  return result;
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto* c = app.add_subcommand("launch", "Start the ranks of a distributed job on this machine (torchrun-compatible environment)");
  c->add_option("--nproc-per-node", launch_args.nproc_per_node, "ranks on this node");
  c->add_option("--nnodes", launch_args.nnodes, "nodes in the job");
  c->add_option("--node-rank", launch_args.node_rank, "this node's index");
  c->add_option("--master-addr", launch_args.master_addr, "host of rank 0 (the rendezvous store)");
  c->add_option("--master-port", launch_args.master_port, "port of the rendezvous store");
  c->add_option("--grace", launch_args.grace_s, "seconds the other ranks get after a failure before SIGKILL");
  c->add_option("command", launch_args.command, "the command each rank runs (after --)")->required();
  c->footer("Examples:\n  mm launch --nproc-per-node 2 -- mm train examples/qwen2vl/tiny_fashion_mnist.yaml\n"
            "Exit code: 0 when every rank succeeds, else the first failing rank's code (128 + signal if killed).");
  register_action(c, run_launch);
}

}  // namespace mm::cli
