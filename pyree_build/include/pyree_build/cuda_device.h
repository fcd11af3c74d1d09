// What CUDA device code expects to be predefined, for `pyree-build bitcode`: clang runs
// with -nocudainc (no CUDA SDK headers, so never a system CUDA by accident) and this
// file is force-included instead, so sources written for NVRTC or nvcc compile unchanged.
// It covers kernel bodies: execution-space attributes, threadIdx/blockIdx/blockDim/
// gridDim and size_t (clang itself provides __syncthreads). Host APIs are absent: IREE launches the code.
#ifndef PYREE_BUILD_CUDA_DEVICE_H_
#define PYREE_BUILD_CUDA_DEVICE_H_

#if !defined(__CUDA__)
#error "pyree_build/cuda_device.h is for CUDA device code: compile with -x cuda"
#endif

typedef __SIZE_TYPE__ size_t;

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ inline __attribute__((always_inline))

// Each coordinate reads a PTX special register when used.
#define PYREE_CUDA_COORD(type, reg)                                                          \
  struct type {                                                                              \
    __device__ __forceinline__ unsigned int get_x() const { return __nvvm_read_ptx_sreg_##reg##_x(); } \
    __device__ __forceinline__ unsigned int get_y() const { return __nvvm_read_ptx_sreg_##reg##_y(); } \
    __device__ __forceinline__ unsigned int get_z() const { return __nvvm_read_ptx_sreg_##reg##_z(); } \
    __declspec(property(get = get_x)) unsigned int x;                                        \
    __declspec(property(get = get_y)) unsigned int y;                                        \
    __declspec(property(get = get_z)) unsigned int z;                                        \
  }

PYREE_CUDA_COORD(pyree_cuda_thread_idx, tid);
PYREE_CUDA_COORD(pyree_cuda_block_idx, ctaid);
PYREE_CUDA_COORD(pyree_cuda_block_dim, ntid);
PYREE_CUDA_COORD(pyree_cuda_grid_dim, nctaid);
#undef PYREE_CUDA_COORD

extern const __device__ __attribute__((weak)) pyree_cuda_thread_idx threadIdx;
extern const __device__ __attribute__((weak)) pyree_cuda_block_idx blockIdx;
extern const __device__ __attribute__((weak)) pyree_cuda_block_dim blockDim;
extern const __device__ __attribute__((weak)) pyree_cuda_grid_dim gridDim;


#endif  // PYREE_BUILD_CUDA_DEVICE_H_
