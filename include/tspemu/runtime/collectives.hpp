// Every collective of the tspemu runtime.
#pragma once

#include "tspemu/runtime/all_gather.hpp"
#include "tspemu/runtime/all_reduce.hpp"
#include "tspemu/runtime/all_to_all.hpp"
#include "tspemu/runtime/barrier.hpp"
#include "tspemu/runtime/broadcast.hpp"
#include "tspemu/runtime/nonblocking.hpp"
#include "tspemu/runtime/reduce.hpp"
#include "tspemu/runtime/reduce_buffers.hpp"
#include "tspemu/runtime/reduce_scatter.hpp"
#include "tspemu/runtime/send_recv.hpp"
#include "tspemu/runtime/sequence_heads_exchange.hpp"
