// Mean cross-entropy over next-token targets, fused with its gradient.
//
// What: loss = mean_n( logsumexp(logits[n]) - logits[n, target[n]] ).
//   torch: F.cross_entropy(logits.view(-1, V), targets.view(-1))
// Requirements: every target in [0, V) (throws std::invalid_argument otherwise); N > 0.
// Guarantees: the loss is accumulated in double whatever T is (one scalar; this is not the
//   bottleneck), the per-row logsumexp in T. backward overwrites dlogits = (softmax - onehot)/N.
#pragma once

#include <cstdint>

namespace tspemu::ref {

template <class T>
double cross_entropy_forward(const T* logits,              // [N, V]
                             const std::int32_t* targets,  // [N]
                             int N, int V);

template <class T>
void cross_entropy_backward(T* dlogits,                   // [N, V], overwritten
                            const T* logits,              // [N, V]
                            const std::int32_t* targets,  // [N]
                            int N, int V);

}  // namespace tspemu::ref
