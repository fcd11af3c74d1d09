"""`tune`: a kernel's knobs swept (`sweep`), each variant checked then timed; GPU variants
(`gpu`), the in-process calls of a check (`calls`), a Ray cluster (`on_ray`, loaded only then).

Named `tuning`, not `tune`: `pyree_build.tune` is the verb's function, which a subpackage of
that name would replace on import."""
