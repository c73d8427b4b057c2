// A SakanaAI-style extension for kb/L1/19_ReLU whose kernel runs on one element while an ATen
// op does the work (written for cudarl-pipe's tests): `at::relu` is spelled through a macro and
// a `using`, so only what the built object imports names it (`at::_ops::relu::call`), and the
// extension-object check must refuse it.
#include <torch/extension.h>

#define ACT(t) at::relu(t)
using Fn = at::Tensor (*)(const at::Tensor&);

__global__ void touch_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}

torch::Tensor forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    touch_kernel<<<1, 1>>>(x.data_ptr<float>(), y.data_ptr<float>(), 1);
    return ACT(x);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("forward", &forward, "ReLU");
}
