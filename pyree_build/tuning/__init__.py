"""`tune`: a kernel's knobs swept (`sweep`, the order of steps and `tune()`), each variant checked
then timed. The steps: the plan and its variants (`plan`), the knobs (`params`), the expected
results and tolerance (`references`), a variant's build and check (`variant_checks`), its
benchmark (`benchmarks`), the choice among variants (`choice`), best.json and the content key
(`records`), a tune applied to a build (`apply`); GPU variants (`gpu`), the in-process calls of
a check (`calls`), a Ray cluster (`on_ray`, loaded only then).

Named `tuning`, not `tune`: `pyree_build.tune` is the verb's function, which a subpackage of
that name would replace on import."""
