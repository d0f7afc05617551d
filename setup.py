"""The one compiled part: the Kineto reader's field scanner (``formats/kineto/scanner.c``).

Optional: where it cannot be built (no C compiler) the install goes on and the reader decodes
with msgspec alone, the same tables more slowly. Everything else is in ``pyproject.toml``.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "xpuprof.formats.kineto.scanner",
            ["src/xpuprof/formats/kineto/scanner.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
