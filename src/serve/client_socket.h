// The socket of an HTTP request, so a handler that waits for generation can see that its client went away.
//
// cpp-httplib 0.11 (the packaged version) hands a handler the request's addresses but not its socket, and its
// writability check (select for writing) does not notice a peer that closed. A non-streamed completion writes
// nothing until it ends, so without this a client that disconnected kept its request running, and its KV
// cells held, until the last token. find_client_socket finds the connected socket by its two addresses (the
// fd stays open until the handler returns, so it cannot be reused meanwhile); client_gone peeks at it.
#pragma once

#include <string>

namespace tandem::serve {

// The fd of this process's TCP socket connected from (remote_addr, remote_port) to (local_addr, local_port),
// as numeric host strings (local_port <= 0: any local address); -1 when none is found (then the caller cannot
// detect a disconnect early).
int find_client_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                       int remote_port);

// True when the peer of a connected socket has closed it or reset it (end of stream or an error on a
// non-blocking peek). Bytes waiting to be read (a pipelined request) leave it alive. fd < 0: false.
bool client_gone(int fd);

}  // namespace tandem::serve
