// A request in flight that shutdown can end (ApiServer::abort_all): generations and embeddings.
#pragma once

namespace serval::server {

class InFlightJob {
 public:
  virtual ~InFlightJob() = default;
  // Submits the job's engine requests. Throws ApiError (503 on a full queue, 400 on a refused
  // request) after aborting what was already submitted.
  virtual void start() = 0;
  // Aborts the job's engine requests; runs on the connection's strand. Its response ends soon.
  virtual void abort_all() = 0;
};

}  // namespace serval::server
