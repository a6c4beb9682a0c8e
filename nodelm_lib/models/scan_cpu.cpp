// The selective scan without autograd as one loop per (sequence, block of channels), for CPUs:
// scan_cpu.py builds it on first use and documents it. With a_s = exp(Delta_s A) and
// b_s = (Delta_s x_s) B_s:
//     h_s = a_s h_{s-1} + b_s,    y_s = sum_n C_{s,n} h_{s,.,n},    h_{-1} = h0 (default 0).
// Each task keeps its state, N vectors of one register's width of channels, in registers while it
// walks the positions: the inputs are read once, y and the last state written once, and no tensor
// of the state's size (T, B, N, D) exists.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <vector>

using Vec = at::vec::Vectorized<float>;

namespace {

// the innermost stride must be 1; batch and position strides are free (delta, B_s and C_s arrive
// as slices of one projection)
void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 3 && t.stride(2) == 1, name, " must be (B, T, K) with unit stride along K; got sizes ",
              t.sizes(), " and strides ", t.strides());
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.device().is_cpu(), name, " must be a float32 CPU tensor");
}

}  // namespace

// softplus as torch's CPU kernel computes it (beta 1, threshold 20), on the same vector functions
inline Vec softplus(const Vec& a) { return Vec::blendv(a.exp().log1p(), a, a > Vec(20.f)); }

// silu as torch's CPU kernel computes it
inline Vec silu(const Vec& a) { return a / (Vec(1.f) + a.neg().exp()); }

// x, delta (B, T, D); A_t, A transposed, (N, D) contiguous; B_s, C_s (B, T, N); h0 (B, D, N) or empty.
// Returns y (B, T, D) and the last state (B, D, N). With `gate` (the layer's whole mixing step, one
// pass): delta is taken before its softplus, and the result is (y + skip x) * silu(gate), with
// skip (D,) and gate (B, T, D).
std::vector<at::Tensor> run(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& A_t,
                            const at::Tensor& B_s, const at::Tensor& C_s, const at::Tensor& h0,
                            const at::Tensor* skip, const at::Tensor* gate) {
  check_rows(x, "x");
  check_rows(delta, "delta");
  check_rows(B_s, "B_s");
  check_rows(C_s, "C_s");
  const bool gated = gate != nullptr;
  if (gated) {
    check_rows(*gate, "gate");
    TORCH_CHECK(skip->is_contiguous() && skip->numel() == x.size(2) && skip->scalar_type() == at::kFloat,
                "skip must be a contiguous float32 (D,)");
  }
  const int64_t batch = x.size(0), T = x.size(1), D = x.size(2), N = A_t.size(0);
  TORCH_CHECK(A_t.is_contiguous() && A_t.size(1) == D, "A_t must be contiguous (N, D) with D = ", D);
  const bool has_h0 = h0.numel() > 0;
  TORCH_CHECK(!has_h0 || (h0.is_contiguous() && h0.size(0) == batch && h0.size(1) == D && h0.size(2) == N),
              "h0 must be contiguous (B, D, N)");
  auto y = at::empty({batch, T, D}, x.options());
  auto last = at::empty({batch, D, N}, x.options());
  const float *px = x.data_ptr<float>(), *pd = delta.data_ptr<float>(), *pa = A_t.data_ptr<float>();
  const float *pB = B_s.data_ptr<float>(), *pC = C_s.data_ptr<float>();
  const float* ph0 = has_h0 ? h0.data_ptr<float>() : nullptr;
  float *py = y.data_ptr<float>(), *pl = last.data_ptr<float>();
  const int64_t xb = x.stride(0), xt = x.stride(1), db = delta.stride(0), dt = delta.stride(1);
  const int64_t bb = B_s.stride(0), bt = B_s.stride(1), cb = C_s.stride(0), ct = C_s.stride(1);
  const float *pz = gated ? gate->data_ptr<float>() : nullptr, *pk = gated ? skip->data_ptr<float>() : nullptr;
  const int64_t zb = gated ? gate->stride(0) : 0, zt = gated ? gate->stride(1) : 0;
  constexpr int64_t W = Vec::size();
  const int64_t blocks = (D + W - 1) / W;  // the last block may be partial: loads and stores of `width`
  at::parallel_for(0, batch * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<Vec> h(N), rate(N);
    float lanes[W];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / blocks, d0 = (task % blocks) * W, width = std::min(W, D - d0);
      for (int64_t n = 0; n < N; ++n) {
        rate[n] = Vec::loadu(pa + n * D + d0, width);
        std::fill(lanes, lanes + W, 0.f);
        if (has_h0)
          for (int64_t k = 0; k < width; ++k) lanes[k] = ph0[(b * D + d0 + k) * N + n];
        h[n] = Vec::loadu(lanes);
      }
      for (int64_t s = 0; s < T; ++s) {
        const Vec raw = Vec::loadu(pd + b * db + s * dt + d0, width);
        const Vec d = gated ? softplus(raw) : raw, xs = Vec::loadu(px + b * xb + s * xt + d0, width);
        const Vec dx = d * xs;
        const float *Bp = pB + b * bb + s * bt, *Cp = pC + b * cb + s * ct;
        Vec acc(0.f);
        for (int64_t n = 0; n < N; ++n) {
          // exp_u20: torch's fast exp (within 20 ulp), which its CPU flash attention's softmax uses;
          // Sleef's exact exp would take about as long as the rest of the layer
          h[n] = (d * rate[n]).exp_u20() * h[n] + dx * Vec(Bp[n]);
          acc = at::vec::fmadd(Vec(Cp[n]), h[n], acc);
        }
        if (gated)  // as the layer does it: y + D x, then times silu(z)
          acc = (acc + Vec::loadu(pk + d0, width) * xs) * silu(Vec::loadu(pz + b * zb + s * zt + d0, width));
        acc.store(py + (b * T + s) * D + d0, width);
      }
      for (int64_t n = 0; n < N; ++n) {
        h[n].store(lanes);
        for (int64_t k = 0; k < width; ++k) pl[(b * D + d0 + k) * N + n] = lanes[k];
      }
    }
  });
  return {y, last};
}

std::vector<at::Tensor> scan(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& A_t,
                             const at::Tensor& B_s, const at::Tensor& C_s, const at::Tensor& h0) {
  return run(x, delta, A_t, B_s, C_s, h0, nullptr, nullptr);
}

std::vector<at::Tensor> gated_scan(const at::Tensor& x, const at::Tensor& delta_raw, const at::Tensor& A_t,
                                   const at::Tensor& B_s, const at::Tensor& C_s, const at::Tensor& h0,
                                   const at::Tensor& skip, const at::Tensor& gate) {
  return run(x, delta_raw, A_t, B_s, C_s, h0, &skip, &gate);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scan", &scan, "the selective scan without autograd (scan_cpu.py)");
  m.def("gated_scan", &gated_scan, "the layer's mixing step around the scan, in the same pass (scan_cpu.py)");
}
