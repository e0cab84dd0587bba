#include "store/metrics_http.h"

#include <spdlog/spdlog.h>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <memory>

namespace depot::store {

namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

namespace {

// One scrape: read a request, answer it, close.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(tcp::socket socket, const std::function<std::string()>& render)
      : stream_(std::move(socket)), render_(render) {}

  void Start() {
    parser_.body_limit(8 * 1024);
    parser_.header_limit(8 * 1024);
    stream_.expires_after(std::chrono::seconds(5));
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](boost::beast::error_code ec, size_t) {
                       if (!ec) self->Answer();
                     });
  }

 private:
  void Answer() {
    const auto& request = parser_.get();
    response_.version(request.version());
    response_.keep_alive(false);
    response_.set(http::field::server, "depotd");
    if (request.method() != http::verb::get && request.method() != http::verb::head) {
      response_.result(http::status::method_not_allowed);
      response_.set(http::field::allow, "GET, HEAD");
      response_.body() = "only GET /metrics is served here\n";
    } else if (request.target() != "/metrics") {
      response_.result(http::status::not_found);
      response_.body() = "not found: depotd serves GET /metrics\n";
    } else {
      response_.result(http::status::ok);
      response_.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      response_.body() = render_();
    }
    response_.prepare_payload();
    http::async_write(stream_, response_,
                      [self = shared_from_this()](boost::beast::error_code, size_t) {
                        boost::beast::error_code ignored;
                        self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
                      });
  }

  boost::beast::tcp_stream stream_;
  const std::function<std::string()>& render_;
  boost::beast::flat_buffer buffer_;
  http::request_parser<http::string_body> parser_;
  http::response<http::string_body> response_;
};

}  // namespace

MetricsHttp::MetricsHttp(boost::asio::io_context& loop, std::function<std::string()> render)
    : acceptor_(loop), accept_retry_(loop, "metrics endpoint"), render_(std::move(render)) {}

Status MetricsHttp::Listen(const std::string& address, uint16_t port) {
  boost::system::error_code ec;
  const auto ip = boost::asio::ip::make_address(address, ec);
  if (ec)
    return Status::InvalidArgument("--metrics-address '" + address + "' is not an IP address");
  const tcp::endpoint endpoint(ip, port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(boost::asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::IoError("cannot serve metrics on " + address + ":" + std::to_string(port) +
                           ": " + ec.message());
  }
  Accept();
  return Status::OK();
}

uint16_t MetricsHttp::port() const {
  boost::system::error_code ec;
  return acceptor_.local_endpoint(ec).port();
}

void MetricsHttp::Close() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.Cancel();
}

void MetricsHttp::Accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec == boost::asio::error::operation_aborted) return;
    if (ec) {
      return accept_retry_.Failed(ec, "HTTP", [this] {
        if (acceptor_.is_open()) Accept();
      });
    } else {
      std::make_shared<Exchange>(std::move(socket), render_)->Start();
    }
    if (acceptor_.is_open()) Accept();
  });
}

}  // namespace depot::store
