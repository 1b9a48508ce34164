// A request in flight that shutdown can end (ApiServer::abort_all): generations and embeddings.
#pragma once

namespace serval::server {

class InFlightJob {
 public:
  virtual ~InFlightJob() = default;
  // Aborts the job's engine requests; runs on the connection's strand. Its response ends soon.
  virtual void abort_all() = 0;
};

}  // namespace serval::server
