// A minimal stand-in for HIP's <hip/hip_runtime.h>, shipped with pyree_build so device
// code for IREE's HIP target compiles with ziglang's clang and no ROCm installed
// (`-nogpuinc` keeps clang from looking for ROCm's headers). It covers what a kernel
// body needs: the execution-space attributes, threadIdx/blockIdx/blockDim/gridDim and
// __syncthreads. Host APIs (hipMalloc, launches) are not here: IREE launches the kernels.
#ifndef PYREE_BUILD_HIP_RUNTIME_H_
#define PYREE_BUILD_HIP_RUNTIME_H_

#if !defined(__HIP__)
#error "hip/hip_runtime.h (pyree_build stand-in) is for HIP device code: compile with -x hip"
#endif

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(threads) __attribute__((amdgpu_flat_work_group_size(1, threads)))

// Each coordinate reads an AMDGPU builtin when used, like HIP's own header does.
#define PYREE_HIP_COORD(type, fx, fy, fz)                                         \
  struct type {                                                                   \
    __device__ __forceinline__ unsigned int get_x() const { return fx; }          \
    __device__ __forceinline__ unsigned int get_y() const { return fy; }          \
    __device__ __forceinline__ unsigned int get_z() const { return fz; }          \
    __declspec(property(get = get_x)) unsigned int x;                             \
    __declspec(property(get = get_y)) unsigned int y;                             \
    __declspec(property(get = get_z)) unsigned int z;                             \
  }

PYREE_HIP_COORD(pyree_hip_thread_idx, __builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(),
                __builtin_amdgcn_workitem_id_z());
PYREE_HIP_COORD(pyree_hip_block_idx, __builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
                __builtin_amdgcn_workgroup_id_z());
PYREE_HIP_COORD(pyree_hip_block_dim, __builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(),
                __builtin_amdgcn_workgroup_size_z());
PYREE_HIP_COORD(pyree_hip_grid_dim, __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(),
                __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(),
                __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z());
#undef PYREE_HIP_COORD

extern const __device__ __attribute__((weak)) pyree_hip_thread_idx threadIdx;
extern const __device__ __attribute__((weak)) pyree_hip_block_idx blockIdx;
extern const __device__ __attribute__((weak)) pyree_hip_block_dim blockDim;
extern const __device__ __attribute__((weak)) pyree_hip_grid_dim gridDim;

__device__ __forceinline__ void __syncthreads() { __builtin_amdgcn_s_barrier(); }

#endif  // PYREE_BUILD_HIP_RUNTIME_H_
