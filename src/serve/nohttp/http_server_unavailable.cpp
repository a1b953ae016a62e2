// HttpServer when tandem is built without cpp-httplib (CMake found no httplib.h): everything else builds, and
// `tandem serve` says what is missing instead of the build failing. CMake compiles this file in place of
// http_server.cpp only then.
#include "core/error.h"
#include "serve/http_server.h"

namespace tandem::serve {

struct HttpServer::Impl {};

HttpServer::HttpServer(Scheduler&, HttpParams) {
  throw Error(
      "tandem was built without cpp-httplib, so `tandem serve` is not available: install it "
      "(Debian/Ubuntu: apt-get install libcpp-httplib-dev, or run scripts/setup.sh) and rebuild");
}
HttpServer::~HttpServer() = default;
int HttpServer::bind() { return 0; }
void HttpServer::serve() {}
void HttpServer::stop() {}

}  // namespace tandem::serve
