// row_sum with cooperative groups: one block per row, a warp tile reduction (cg::reduce).
#include <cuda_runtime.h>
#include <stdint.h>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
__global__ void row_sum_cg(const float* x, float* out, int64_t rows, int64_t cols) {
    __shared__ float partial[32];
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int64_t r = blockIdx.x;
    float acc = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) acc += x[r * cols + c];
    acc = cg::reduce(warp, acc, cg::plus<float>());
    if (warp.thread_rank() == 0) partial[warp.meta_group_rank()] = acc;
    block.sync();
    if (warp.meta_group_rank() == 0) {
        float v = warp.thread_rank() < warp.meta_group_size() ? partial[warp.thread_rank()] : 0.0f;
        v = cg::reduce(warp, v, cg::plus<float>());
        if (warp.thread_rank() == 0) out[r] = v;
    }
}
extern "C" void launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    row_sum_cg<<<(unsigned)rows, 256, 0, stream>>>(x, out, rows, cols);
}
