// Finding and probing a request's client socket (client_socket.h).
#include "serve/client_socket.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace tandem::serve {
namespace {

// The numeric host and the port of a socket address.
bool numeric(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(p);
  return true;
}

bool matches(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr,
             int remote_port) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  std::string host;
  int port = 0;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || !numeric(a, len, host, port) ||
      port != remote_port || host != remote_addr)
    return false;
  if (local_port <= 0) return true;  // the library did not say: the peer's address is unique enough
  len = sizeof a;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || !numeric(a, len, host, port) ||
      port != local_port)
    return false;
  return local_addr.empty() || host == local_addr;
}

}  // namespace

int find_client_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                       int remote_port) {
  if (remote_port <= 0) return -1;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (const dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
    if (matches(int(fd), local_addr, local_port, remote_addr, remote_port)) {
      found = int(fd);
      break;
    }
  }
  closedir(d);
  return found;
}

bool client_gone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;  // nothing happened: still connected
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;  // a pipelined request waits to be read
  if (n == 0) return true;  // orderly close
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace tandem::serve
