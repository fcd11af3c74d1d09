#version 450
// acc[i] *= a[i] for the first n elements: the result is written over binding 1,
// which the program declares as tied to its result.
layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(set = 0, binding = 0) buffer readonly Factor { float values[]; } factor;
layout(set = 0, binding = 1) buffer Acc { float values[]; } acc;
layout(push_constant) uniform Constants { uint n; } constants;

void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < constants.n) {
    acc.values[i] *= factor.values[i];
  }
}
