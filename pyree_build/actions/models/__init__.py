"""Real models: import an ONNX model (importer), list the op groups a transform spec can match
(ops), generate a replacement for one (replace: the spec, the C import, a CMake snippet) and
check a module against the framework's own numbers (verify)."""
