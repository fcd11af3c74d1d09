"""The model path: a user's kernel in a real model.

`ops` lists a model's op groups, `replace` writes a kernel, a transform spec and the build for
chosen groups, `verify` runs the replaced module against the framework on drawn inputs.
Inside, three layers, each importing only the ones below it:

- `ir`: the program as IREE sees it. `importer` (ONNX -> MLIR, weights kept out of the text),
  `program` (the one reading of a program and the IR queries on it), `groups` and `captures`
  (which ops form a group, what it reads), `merge`, `analysis` (one pass: every group of a
  program, once), `limits` (how long a tool may run on a model's behalf).
- `codegen`: a group's computation as a loop nest (`loopnest`), written out by one emitter per
  output language behind one base (`emitter.NestEmitter`: which name holds a value at a point,
  a stage's body; a language adds its loads and scalar ops): `c_reference` (one loop nest per
  op; also C's scalar forms), `c_tiled`, `c_rows` (C for the CPU plugins), `gpu_source` (GLSL,
  CUDA, HIP: the entry; `gpu_emitter` the language-neutral GPU emitter, `glsl` and `cuda_c` each
  language's forms, mixed in).
- the verbs' modules: `spec` (the transform spec that calls the kernel), `replace` (which
  groups, checked, written), `kernel_source` (a group's kernel text), `cmake_project` (the
  CMakeLists.txt `replace` writes), `ops`, `verify` and `verify_inputs` (the draws that reach
  every input's meaningful range).
"""
