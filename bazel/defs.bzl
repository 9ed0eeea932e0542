"""Test rules shared by every package: one place for the test conventions.

dpl_test: a doctest unit test; `bazel test //...` (and so CI) runs it.
dpl_gpu_test: a doctest test that needs a GPU. Tagged gpu + manual, so
`bazel test //...` skips it (CI has no GPU); tools/gpu/stage.sh builds it and
tools/gpu/suite.sh runs it on the GPU machine. Linked statically: one binary to
carry there.
"""

def dpl_test(name, srcs, deps = [], **kwargs):
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + ["@system//:doctest"],
        **kwargs
    )

def dpl_gpu_test(name, srcs, deps = [], **kwargs):
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + ["@system//:doctest"],
        tags = ["gpu", "manual"],
        linkstatic = True,
        **kwargs
    )
