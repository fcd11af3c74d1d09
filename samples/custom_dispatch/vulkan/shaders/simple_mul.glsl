#version 450
// out[i] = a[i] * b[i] for the first n elements. IREE passes the buffers as set 0
// bindings in the order of the export's layout, and the dispatch's i32 operands as
// push constants, 4 bytes each, in order.
layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(set = 0, binding = 0) buffer readonly Lhs { float values[]; } lhs;
layout(set = 0, binding = 1) buffer readonly Rhs { float values[]; } rhs;
layout(set = 0, binding = 2) buffer writeonly Out { float values[]; } result;
layout(push_constant) uniform Constants { uint n; } constants;

void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < constants.n) {
    result.values[i] = lhs.values[i] * rhs.values[i];
  }
}
