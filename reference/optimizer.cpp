#include "tspemu/reference/optimizer.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace tspemu::ref {

namespace {

void require(bool ok, const char* field, double value, const char* rule) {
  if (!ok)
    throw std::invalid_argument(std::string("OptimizerConfig: ") + field + "=" +
                                std::to_string(value) + " " + rule);
}

}  // namespace

void OptimizerConfig::validate() const {
  require(std::isfinite(lr) && lr > 0, "lr", lr, "must be finite and > 0");
  require(beta1 >= 0 && beta1 < 1, "beta1", beta1, "must be in [0, 1)");
  require(beta2 >= 0 && beta2 < 1, "beta2", beta2, "must be in [0, 1)");
  require(std::isfinite(eps) && eps > 0, "eps", eps, "must be finite and > 0");
  require(std::isfinite(weight_decay) && weight_decay >= 0, "weight_decay", weight_decay,
          "must be finite and >= 0");
}

std::string OptimizerConfig::to_string() const {
  std::ostringstream os;
  os << optimizer_kind_name(kind) << " lr=" << lr;
  if (kind == OptimizerKind::adamw)
    os << " beta1=" << beta1 << " beta2=" << beta2 << " eps=" << eps;
  os << " wd=" << weight_decay;
  return os.str();
}

OptimizerKind optimizer_kind_named(const std::string& name) {
  if (name == "adamw") return OptimizerKind::adamw;
  if (name == "sgd") return OptimizerKind::sgd;
  throw std::invalid_argument("unknown optimizer '" + name + "' (known: adamw, sgd)");
}

const char* optimizer_kind_name(OptimizerKind k) {
  return k == OptimizerKind::adamw ? "adamw" : "sgd";
}

template <class T>
void adamw_update(std::span<T> w, std::span<const T> g, std::span<T> m, std::span<T> v,
                  const OptimizerConfig& c, bool decay, std::int64_t step) {
  if (g.size() != w.size() || m.size() != w.size() || v.size() != w.size() || step < 1)
    throw std::invalid_argument(
        "adamw_update: w " + std::to_string(w.size()) + ", g " + std::to_string(g.size()) + ", m " +
        std::to_string(m.size()) + ", v " + std::to_string(v.size()) +
        " elements (must be equal), step " + std::to_string(step) + " (must be >= 1)");
  // Scalars in double, rounded once to T, as torch computes them in Python floats.
  const double t = static_cast<double>(step);
  const T b1 = static_cast<T>(c.beta1), b2 = static_cast<T>(c.beta2);
  const T one_minus_b1 = static_cast<T>(1 - c.beta1), one_minus_b2 = static_cast<T>(1 - c.beta2);
  const T keep = static_cast<T>(1 - c.lr * c.weight_decay);
  const T step_size = static_cast<T>(c.lr / (1 - std::pow(c.beta1, t)));
  const T bc2_sqrt = static_cast<T>(std::sqrt(1 - std::pow(c.beta2, t)));
  const T eps = static_cast<T>(c.eps);
  for (std::size_t i = 0; i < w.size(); ++i) {
    // torch: param.mul_(1 - lr * wd)
    if (decay) w[i] *= keep;
    // torch: exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
    m[i] = b1 * m[i] + one_minus_b1 * g[i];
    v[i] = b2 * v[i] + one_minus_b2 * g[i] * g[i];
    // torch: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    //        param.addcdiv_(exp_avg, denom, value=-step_size)
    const T denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    w[i] -= step_size * (m[i] / denom);
  }
}

template <class T>
void sgd_update(std::span<T> w, std::span<const T> g, const OptimizerConfig& c, bool decay) {
  if (g.size() != w.size())
    throw std::invalid_argument("sgd_update: w " + std::to_string(w.size()) + " and g " +
                                std::to_string(g.size()) + " elements (must be equal)");
  const T keep = static_cast<T>(1 - c.lr * c.weight_decay), lr = static_cast<T>(c.lr);
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (decay) w[i] *= keep;
    w[i] -= lr * g[i];
  }
}

template <class T>
Optimizer<T>::Optimizer(const OptimizerConfig& c) : c_(c) {
  c_.validate();
}

template <class T>
void Optimizer<T>::update(std::size_t index, std::span<T> w, std::span<const T> g, bool decay) {
  if (step_ < 1) throw std::logic_error("Optimizer::update before begin_step");
  if (c_.kind == OptimizerKind::sgd) {
    sgd_update<T>(w, g, c_, decay);
    return;
  }
  if (index >= m_.size()) {
    m_.resize(index + 1);
    v_.resize(index + 1);
  }
  if (m_[index].empty()) {
    m_[index].assign(w.size(), T(0));
    v_[index].assign(w.size(), T(0));
  }
  adamw_update<T>(w, g, m_[index], v_[index], c_, decay, step_);
}

template <class T>
void Optimizer<T>::step(ModelWeights<T>& w, const ModelWeights<T>& grads) {
  begin_step();
  auto params = parameters(w);
  const auto gs = parameters(grads);
  for (std::size_t i = 0; i < params.size(); ++i)
    update(i, *params[i].data, *gs[i].data, params[i].shape.size() == 2);
}

template <class T>
void Optimizer<T>::step(std::vector<LayerWeights<T>>& w,
                        const std::vector<LayerWeights<T>>& grads) {
  begin_step();
  std::size_t index = 0;
  for (std::size_t l = 0; l < w.size(); ++l) {
    auto params = w[l].named();
    const auto gs = grads[l].named();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string_view name = params[i].first;
      update(index++, *params[i].second, *gs[i].second, !name.ends_with("norm"));
    }
  }
}

#define TSPEMU_OPTIMIZER(T)                                                                    \
  template void adamw_update<T>(std::span<T>, std::span<const T>, std::span<T>, std::span<T>,  \
                                const OptimizerConfig&, bool, std::int64_t);                   \
  template void sgd_update<T>(std::span<T>, std::span<const T>, const OptimizerConfig&, bool); \
  template class Optimizer<T>;
TSPEMU_OPTIMIZER(float)
TSPEMU_OPTIMIZER(double)
#undef TSPEMU_OPTIMIZER

}  // namespace tspemu::ref
