"""Builds perfsdk's one C extension, ``perfsdk._hotpath`` (the step wrappers' enter/exit).

Everything else is in pyproject.toml. The extension is optional: where it cannot be built (no
compiler, an unusual platform) the install still succeeds and perfsdk runs the same algorithm in
Python (``perfsdk.Monitor(...).hot_path == "python"``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "perfsdk._hotpath",
            sources=["perfsdk/_hotpath.c"],
            optional=True,
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-field-initializers"],
        )
    ]
)
