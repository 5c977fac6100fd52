#pragma once
// The in-process communicator: the ranks are threads of one process (the CPU backend's
// tensor-parallel ranks under TpBackend, and the tests). The ranks meet at a shared barrier,
// read each other's buffers directly, and every rank sums the contributions in rank order
// (d0 + d1 + ... ), so the result is bit-identical on every rank and from run to run.
#include <memory>
#include <vector>

#include "backend/parallel/communicator.h"

namespace gptoss {

// `world` communicators of one group; communicator r is rank r's, to be used by one thread.
std::vector<std::unique_ptr<Communicator>> make_local_communicators(int world);

}  // namespace gptoss
