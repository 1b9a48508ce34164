// Errors of the multi-node control plane: rendezvous failures, lost peers, timeouts.
#pragma once
#include "base/error.h"

namespace serval::dist {

// The rendezvous or the control channel failed: a node never arrived, a config mismatch, a
// malformed frame, a refused connection. `what()` names the node(s) and the address.
class DistError : public Error {
 public:
  using Error::Error;
};

// A peer that had joined disconnected or went silent past the heartbeat bound, or node 0
// aborted the group because some other peer was lost. The group cannot continue.
class PeerLost : public DistError {
 public:
  using DistError::DistError;
};

// A blocking call reached its own deadline while every peer was still alive.
class DistTimeout : public DistError {
 public:
  using DistError::DistError;
};

}  // namespace serval::dist
