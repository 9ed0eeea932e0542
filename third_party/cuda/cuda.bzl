"""cuda_library: compile .cu files with nvcc in a genrule, wrap the objects in a cc_library.

All nvcc flags live here (NVCC_FLAGS), so every kernel is built the same way.
"""

# Hopper machine code (sm_90a enables wgmma/setmaxnreg) plus compute_90 PTX so a
# newer driver or GPU can still JIT the kernels.
NVCC_FLAGS = [
    "-O3",
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_90,code=compute_90",
    "-lineinfo",
    # Smallest fatbins (the matvec object: 10.2 MB -> 1.3 MB): every static
    # binary embeds every kernel, and the GPU machine gets them over a 64 MiB
    # carry. Decompression happens once, when the module loads.
    "-compress-mode=size",
]

def _dep_headers_impl(ctx):
    return [DefaultInfo(files = depset(transitive = [
        d[CcInfo].compilation_context.headers
        for d in ctx.attr.deps
    ]))]

# Every header the deps make visible (transitively), as plain files: nvcc's
# genrule lists them as inputs, so editing a dependency's header recompiles
# the .cu files that include it.
_dep_headers = rule(
    implementation = _dep_headers_impl,
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc.

    Args:
      name: target name.
      srcs: .cu files (each becomes one object).
      hdrs: headers exported to dependents and visible to nvcc.
      deps: cc_library dependencies (their headers are visible to nvcc).
      copts: extra nvcc flags.
      **kwargs: passed to the cc_library.
    """
    _dep_headers(name = name + "_dep_headers", deps = deps)
    objs = []
    for src in srcs:
        obj = "_objs_%s/%s.o" % (name, src.replace("/", "_"))
        native.genrule(
            name = "%s_%s_nvcc" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + hdrs + [":%s_dep_headers" % name, "@cuda//:toolkit"],
            outs = [obj],
            cmd = " ".join([
                "$(location @cuda//:nvcc)",
                " ".join(NVCC_FLAGS + copts),
                "-I. -I$(GENDIR) -Iexternal/cuda/include",
                "-c $(location %s)" % src,
                "-o $@",
            ]),
            tools = ["@cuda//:nvcc"],
            message = "nvcc %s" % src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart_static"],
        linkstatic = True,
        alwayslink = True,
        **kwargs
    )
